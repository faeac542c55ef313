// Package democp is meshctl's demo control plane: a small go-control-plane ADS
// server (snapshot cache, plaintext TCP) that serves the demo pod a listener with
// its route and a cluster with its endpoints, so that a new user sees
// configuration flow from a discovery server through xds-relay to Envoy, and
// Istio's name table (NDS) naming the demo backend, which the relay keeps for the
// pod's DNS proxy.
package democp

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/grpcserve"
	"github.com/meshagent/meshagent/pkg/nds"
	"google.golang.org/grpc"
)

// Config says where to listen and whom to serve.
type Config struct {
	Addr string // host:port; port 0 picks one
	// NodeIDs are the Envoy node ids served (the launcher's are "sidecar~<pod>").
	// Empty: every node gets the demo configuration.
	NodeIDs []string
	// ListenerPort is the port of the demo listener Envoy opens; 0: DefaultListenerPort.
	ListenerPort uint32
	// BackendAddr is the demo cluster's one endpoint; empty: DefaultBackendAddr.
	BackendAddr string
}

// Defaults for the demo resources.
const (
	DefaultListenerPort = 18080
	DefaultBackendAddr  = "127.0.0.1:18081"
	anyNode             = "*"
)

// Server is the demo control plane.
type Server struct {
	cfg   Config
	log   hclog.Logger
	cache cache.SnapshotCache
	names *cache.LinearCache // the name table, the same for every node
	ids   map[string]bool

	bound chan struct{}
	mu    sync.Mutex
	addr  net.Addr
}

// nodeHash keys the cache by node id, or by one shared key when no ids are given.
type nodeHash struct{ ids map[string]bool }

func (h nodeHash) ID(n *corev3.Node) string {
	if len(h.ids) == 0 {
		return anyNode
	}
	return n.GetId()
}

// New returns the control plane; it does not listen until Run.
func New(cfg Config, log hclog.Logger) *Server {
	if cfg.ListenerPort == 0 {
		cfg.ListenerPort = DefaultListenerPort
	}
	if cfg.BackendAddr == "" {
		cfg.BackendAddr = DefaultBackendAddr
	}
	ids := map[string]bool{}
	for _, id := range cfg.NodeIDs {
		ids[id] = true
	}
	return &Server{cfg: cfg, log: log, ids: ids, bound: make(chan struct{}),
		cache: cache.NewSnapshotCache(true, nodeHash{ids: ids}, nil),
		names: cache.NewLinearCache(nds.TypeURL)}
}

// Bound is closed once the listener is bound.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// Addr is the bound address, nil before Run binds.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Run serves until ctx ends and returns nil then; shutdown takes at most two seconds.
func (s *Server) Run(ctx context.Context) error {
	snap, err := Snapshot("1", s.cfg.ListenerPort, s.cfg.BackendAddr)
	if err != nil {
		return err
	}
	keys := s.cfg.NodeIDs
	if len(keys) == 0 {
		keys = []string{anyNode}
	}
	for _, id := range keys {
		if err := s.cache.SetSnapshot(ctx, id, snap); err != nil {
			return fmt.Errorf("demo snapshot for %s: %w", id, err)
		}
	}
	names, err := NameTable(s.cfg.BackendAddr)
	if err != nil {
		return err
	}
	// One resource without a name, as istiod sends the table.
	if err := s.names.UpdateResource("", nds.Message(names)); err != nil {
		return fmt.Errorf("demo name table: %w", err)
	}
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return classify(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return classify(r.GetTypeUrl()) },
		Caches:        map[string]cache.Cache{"snap": s.cache, "nds": s.names},
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen demo control plane %s: %w", s.cfg.Addr, err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, xdsserver.NewServer(ctx, mux, s.callbacks()))
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()
	close(s.bound)
	s.log.Info("demo control plane listening", "addr", ln.Addr().String(), "nodes", keys)
	// ADS streams never end on their own: the graceful stop waits 2 s for them.
	if err := grpcserve.Serve(ctx, gs, ln, 2*time.Second); err != nil {
		return fmt.Errorf("demo control plane: %w", err)
	}
	return nil
}

func classify(typeURL string) string {
	if typeURL == nds.TypeURL {
		return "nds"
	}
	return "snap"
}

func (s *Server) callbacks() xdsserver.Callbacks {
	return xdsserver.CallbackFuncs{
		StreamRequestFunc: func(id int64, r *discoveryv3.DiscoveryRequest) error {
			if n := r.GetNode().GetId(); n != "" && len(s.ids) > 0 && !s.ids[n] {
				s.log.Warn("unknown node asks for config", "node", n, "type", r.GetTypeUrl())
			}
			if r.GetErrorDetail() != nil {
				s.log.Warn("config rejected", "stream", id, "type", r.GetTypeUrl(), "error", r.GetErrorDetail().GetMessage())
				return nil
			}
			s.log.Debug("discovery request", "stream", id, "type", r.GetTypeUrl(), "version", r.GetVersionInfo())
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discoveryv3.DiscoveryRequest, r *discoveryv3.DiscoveryResponse) {
			s.log.Info("config sent", "stream", id, "type", r.GetTypeUrl(), "version", r.GetVersionInfo(), "resources", len(r.GetResources()))
		},
	}
}
