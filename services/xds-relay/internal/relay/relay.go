// Package relay is the ADS relay: Envoy connects on a unix socket, and every
// downstream stream (state of the world or delta) is relayed on its own upstream
// stream, as Istio's XdsProxy does. Messages pass through as raw bytes; the relay
// reads only their headers, consumes the agent's own types (see Handler) and
// reports connections and NACKs as events.
package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/grpcserve"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
)

// Handler consumes the responses of one type URL that are meant for the agent,
// not for Envoy. The relay ACKs a response upstream when Handle returns nil and
// NACKs it with the error otherwise; the response is never forwarded.
type Handler interface {
	TypeURL() string
	Handle(ctx context.Context, resources []*anypb.Any) error
}

// Dialer gives the upstream connection for one downstream stream, with the
// metadata (token, ClusterID, XDS_HEADER_*) to send on it, and a release func the
// relay calls when the stream has ended.
type Dialer interface {
	Dial(ctx context.Context) (*grpc.ClientConn, metadata.MD, func(), error)
	Address() string
}

// Publisher sends an event without blocking the stream that reports it.
type Publisher interface {
	Publish(subject string, p events.Payload)
}

// WindowSize is the HTTP/2 flow-control window of the relay's streams and
// connections, both ways (the upstream dialer uses it too), as Istio's agent
// sets it: fixed, so that gRPC sends no BDP-estimation pings, and large enough
// that a response of a few hundred kilobytes never waits for a window update.
const WindowSize = 1 << 20

// Config is the relay's part of the service configuration.
type Config struct {
	Pod        events.PodRef
	Socket     string      // unix socket path Envoy connects to
	SocketMode os.FileMode // the socket's permissions; zero means DefaultSocketMode
	MaxMsgSize int         // bytes, both directions
	// Rewriters change responses of their types before Envoy sees them (ECDS's
	// Wasm remote load: internal/wasm).
	Rewriters []Rewriter
}

// Server serves ADS on the socket and relays every stream upstream.
type Server struct {
	cfg      Config
	dial     Dialer
	handlers map[string]Handler
	// rewriters are Config.Rewriters by type URL.
	rewriters map[string]Rewriter
	pub       Publisher
	log       hclog.Logger
	m         *metrics

	nextID atomic.Uint64
	bound  chan struct{}
	once   sync.Once
	mu     sync.Mutex
	addr   net.Addr
	// stop ends every live stream when Run's context is cancelled.
	stop     chan struct{}
	stopOnce sync.Once

	// live are the streams Debug may ask on, oldest first; debugTurn lets one
	// question at a time be in flight.
	liveMu    sync.Mutex
	live      []*stream
	debugTurn chan struct{}
	// health is the last report of ReportHealth (nil: none yet), guarded by liveMu.
	health *Health
}

// New returns a relay; it does not listen until Run. Metrics go to reg (nil: none).
func New(cfg Config, d Dialer, handlers []Handler, pub Publisher, reg prometheus.Registerer, log hclog.Logger) (*Server, error) {
	if cfg.Socket == "" {
		return nil, errors.New("relay: socket path required")
	}
	if cfg.MaxMsgSize <= 0 {
		return nil, errors.New("relay: max message size must be positive")
	}
	hs := map[string]Handler{}
	for _, h := range handlers {
		if _, dup := hs[h.TypeURL()]; dup {
			return nil, fmt.Errorf("relay: two handlers for %s", h.TypeURL())
		}
		hs[h.TypeURL()] = h
	}
	rws := map[string]Rewriter{}
	for _, r := range cfg.Rewriters {
		if _, dup := hs[r.TypeURL()]; dup {
			return nil, fmt.Errorf("relay: %s both consumed and rewritten", r.TypeURL())
		}
		if _, dup := rws[r.TypeURL()]; dup {
			return nil, fmt.Errorf("relay: two rewriters for %s", r.TypeURL())
		}
		rws[r.TypeURL()] = r
	}
	return &Server{cfg: cfg, dial: d, handlers: hs, rewriters: rws, pub: pub, log: log, m: newMetrics(reg),
		bound: make(chan struct{}), stop: make(chan struct{}), debugTurn: make(chan struct{}, 1)}, nil
}

// Bound is closed once the socket is bound.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// Addr is the bound socket address, nil before Run binds it.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Ready reports whether Envoy can connect: the socket is bound. Like Istio, the
// upstream being reachable is not part of readiness.
func (s *Server) Ready() error {
	select {
	case <-s.bound:
		return nil
	default:
		return errors.New("xds socket not bound yet")
	}
}

// Run serves until ctx is cancelled, then ends every stream and stops within a
// few seconds. It returns nil on cancellation.
func (s *Server) Run(ctx context.Context) error {
	mode := s.cfg.SocketMode
	if mode == 0 {
		mode = DefaultSocketMode
	}
	ln, err := Listen(s.cfg.Socket, mode)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(
		grpc.ForceServerCodecV2(codec{}),
		grpc.MaxRecvMsgSize(s.cfg.MaxMsgSize),
		grpc.MaxSendMsgSize(s.cfg.MaxMsgSize),
		grpc.InitialWindowSize(WindowSize),
		grpc.InitialConnWindowSize(WindowSize),
	)
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: adsService,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{
			{StreamName: "StreamAggregatedResources", ServerStreams: true, ClientStreams: true,
				Handler: func(_ any, ss grpc.ServerStream) error { return s.relay(sotw, ss) }},
			{StreamName: "DeltaAggregatedResources", ServerStreams: true, ClientStreams: true,
				Handler: func(_ any, ss grpc.ServerStream) error { return s.relay(delta, ss) }},
		},
	}, struct{}{})
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()
	s.once.Do(func() { close(s.bound) })
	s.log.Info("xds relay listening", "socket", s.cfg.Socket, "mode", fmt.Sprintf("%#o", mode), "upstream", s.dial.Address())
	// Relayed streams end when s.stop closes, so the graceful stop has them end first.
	stopStreams := context.AfterFunc(ctx, func() { s.stopOnce.Do(func() { close(s.stop) }) })
	defer stopStreams()
	err = grpcserve.Serve(ctx, gs, ln, 5*time.Second)
	_ = ln.Close() // removes the socket while it is still ours
	if err != nil {
		return fmt.Errorf("xds relay: %w", err)
	}
	return nil
}
