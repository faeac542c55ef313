// Package debugtap is the pod's debug tap, as Istio's agent served it with
// PROXY_XDS_DEBUG_VIA_AGENT on localhost:15004: a client on the pod asks for one
// of istiod's debug types (istio.io/debug/syncz, istio.io/debug/config_dump) and
// the relay asks istiod on Envoy's own ADS stream, which carries the pod's
// identity, then returns istiod's answer. One port serves both forms Istio's
// did: ADS over plaintext gRPC (one request, one response, then the stream ends)
// and HTTP GET /debug/<name>[?resourceName=<name>], answered as JSON.
package debugtap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
)

// Istio's agent waited this long for istiod: 5 s for an HTTP question, 15 s for
// a gRPC one.
const (
	DefaultHTTPTimeout = 5 * time.Second
	DefaultGRPCTimeout = 15 * time.Second
)

// Asker asks the discovery server a debug question (relay.Server implements it).
type Asker interface {
	Debug(ctx context.Context, typeURL string, names []string) (*xdswire.DiscoveryResponse, error)
}

var _ Asker = (*relay.Server)(nil)

// Config is where the tap listens and how long it waits for istiod.
type Config struct {
	Addr        string        // host:port; Istio's is localhost:15004
	HTTPTimeout time.Duration // zero: DefaultHTTPTimeout
	GRPCTimeout time.Duration // zero: DefaultGRPCTimeout
}

// Server is the tap. It does not listen until Run.
type Server struct {
	cfg   Config
	ask   Asker
	log   hclog.Logger
	grpc  *grpc.Server
	mu    sync.Mutex
	addr  net.Addr
	bound chan struct{}
}

// New returns the tap for cfg, asking through ask.
func New(cfg Config, ask Asker, log hclog.Logger) (*Server, error) {
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("debug tap: address %q: %w", cfg.Addr, err)
	}
	if cfg.HTTPTimeout <= 0 {
		cfg.HTTPTimeout = DefaultHTTPTimeout
	}
	if cfg.GRPCTimeout <= 0 {
		cfg.GRPCTimeout = DefaultGRPCTimeout
	}
	s := &Server{cfg: cfg, ask: ask, log: log, bound: make(chan struct{})}
	// Envoy's ADS service on pkg/xdswire's codec, as the relay serves it: the pod
	// binary links none of Envoy's generated types (tests/house TestPodLinksNoEnvoyTypes).
	s.grpc = grpc.NewServer(grpc.ForceServerCodecV2(xdswire.Codec{}))
	s.grpc.RegisterService(&grpc.ServiceDesc{
		ServiceName: "envoy.service.discovery.v3.AggregatedDiscoveryService",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{
			{StreamName: "StreamAggregatedResources", ServerStreams: true, ClientStreams: true,
				Handler: func(_ any, ss grpc.ServerStream) error { return s.stream(ss) }},
			{StreamName: "DeltaAggregatedResources", ServerStreams: true, ClientStreams: true,
				Handler: func(any, grpc.ServerStream) error { return errNoDelta }},
		},
	}, struct{}{})
	return s, nil
}

// Ready reports whether the tap is listening.
func (s *Server) Ready() error {
	select {
	case <-s.bound:
		return nil
	default:
		return errors.New("debug tap not listening yet")
	}
}

// Addr is the bound address, nil before Run binds it.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Run serves until ctx ends and returns nil then; it fails when the address
// cannot be bound (as Istio's agent fails to start).
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("debug tap: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/", s.serveHTTP)
	mux.HandleFunc("/debug", s.serveHTTP)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // gRPC without TLS, on the same port
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
				s.grpc.ServeHTTP(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		}),
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
	}
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()
	close(s.bound)
	s.log.Info("debug tap listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("debug tap: %w", err)
	case <-ctx.Done():
	}
	// Questions wait at most GRPCTimeout; give them that long to finish.
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.GRPCTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	<-errc
	s.grpc.Stop()
	return nil
}

// stream is the tap's gRPC form, Envoy's ADS state of the world: it answers one
// request of an istio.io/debug/<name> type with istiod's response, then ends the
// stream (as Istio's tap did).
func (s *Server) stream(ss grpc.ServerStream) error {
	var req xdswire.DiscoveryRequest
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	if !relay.IsDebugType(req.TypeURL) {
		return status.Errorf(codes.InvalidArgument, "debug tap: type %q is not one of istiod's debug types: want %s<name>, such as %ssyncz",
			req.TypeURL, relay.DebugTypePrefix, relay.DebugTypePrefix)
	}
	ctx, cancel := context.WithTimeout(ss.Context(), s.cfg.GRPCTimeout)
	defer cancel()
	resp, err := s.ask.Debug(ctx, req.TypeURL, req.ResourceNames)
	if err != nil {
		return status.Error(grpcCode(err), "debug tap: "+explain(err, req.TypeURL))
	}
	return ss.SendMsg(resp)
}

// errNoDelta refuses the delta form: Istio's tap had none either.
var errNoDelta = status.Error(codes.Unimplemented, "debug tap: ask with StreamAggregatedResources (state of the world); it has no delta form")

// serveHTTP answers GET /debug/<name>[?resourceName=<r>] with istiod's answer
// to istio.io/debug/<name> as JSON.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "debug tap: GET only", http.StatusMethodNotAllowed)
		return
	}
	typeURL := "istio.io" + r.URL.Path
	if !relay.IsDebugType(typeURL) || strings.Contains(strings.TrimPrefix(typeURL, relay.DebugTypePrefix), "/") {
		http.Error(w, fmt.Sprintf("debug tap: %s is not a debug type: ask for /debug/<name>, such as /debug/syncz", r.URL.Path), http.StatusBadRequest)
		return
	}
	q := r.URL.Query()
	var names []string
	if n := q.Get("resourceName"); n != "" {
		names = []string{n}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.HTTPTimeout)
	defer cancel()
	resp, err := s.ask.Debug(ctx, typeURL, names)
	if err != nil {
		http.Error(w, "debug tap: "+explain(err, typeURL), httpCode(err))
		return
	}
	b, err := renderJSON(resp)
	if err != nil {
		http.Error(w, "debug tap: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// jsonResponse is a response as the HTTP form returns it: protojson's field
// names, each resource in protojson when this binary links its type and every
// type nested in it, else as plainResource. The relay links none of istiod's
// debug answer types (envoy.service.status.v3.ClientConfig, envoy.admin.v3's
// config dumps): they would add 6.7 MB to its stripped binary, for a form whose
// readers can decode the bytes (or ask over gRPC, which returns them as they came).
type jsonResponse struct {
	VersionInfo string            `json:"versionInfo,omitempty"`
	Resources   []json.RawMessage `json:"resources"`
	TypeURL     string            `json:"typeUrl"`
	Nonce       string            `json:"nonce,omitempty"`
}

// plainResource is a resource whose type (or a type inside it) the relay does
// not link: its type URL and its bytes, in base64.
type plainResource struct {
	TypeURL string `json:"typeUrl"`
	Value   []byte `json:"value"`
}

func renderJSON(r *xdswire.DiscoveryResponse) ([]byte, error) {
	out := jsonResponse{VersionInfo: r.VersionInfo, TypeURL: r.TypeURL, Nonce: r.Nonce, Resources: []json.RawMessage{}}
	for _, a := range r.Resources {
		b, err := protojson.Marshal(&anypb.Any{TypeUrl: a.TypeURL, Value: a.Value})
		if err != nil {
			if b, err = json.Marshal(plainResource{TypeURL: a.TypeURL, Value: a.Value}); err != nil {
				return nil, err
			}
		}
		out.Resources = append(out.Resources, b)
	}
	return json.MarshalIndent(out, "", "  ")
}

// explain words a Debug error for the client.
func explain(err error, typeURL string) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("the discovery server did not answer %s in time", typeURL)
	default:
		return err.Error()
	}
}

func grpcCode(err error) codes.Code {
	switch {
	case errors.Is(err, relay.ErrNotDebugType):
		return codes.InvalidArgument
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	default: // ErrNoStream, ErrStreamEnded
		return codes.Unavailable
	}
}

// httpCode maps a Debug error as Istio's tap did: 503 when not connected, 504
// when istiod does not answer in time.
func httpCode(err error) int {
	switch {
	case errors.Is(err, relay.ErrNotDebugType):
		return http.StatusBadRequest
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	default:
		return http.StatusServiceUnavailable
	}
}
