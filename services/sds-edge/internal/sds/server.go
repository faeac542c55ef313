// Package sds serves envoy.service.secret.v3.SecretDiscoveryService from the secret
// store on a unix socket: StreamSecrets (state of the world), DeltaSecrets
// (incremental) and FetchSecrets, with real versions, nonces, ACK and NACK.
//
// It is written on gRPC directly rather than on go-control-plane's server and
// snapshot cache because SDS needs semantics that cache does not give: an unknown
// resource name must fail the stream instead of waiting forever, resources are
// resolved lazily (file-cert:, file-root:), a push must wake only the streams that
// watch the changed resource, and every NACK and serve must reach our events. Its
// messages are pkg/xdswire's, registered with a hand-written service description
// and xdswire's codec, so that sds-edge links none of go-control-plane's generated
// types (docs/benchmarks.md, "Per-pod memory"); its tests talk to it with them.
package sds

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// Observer hears what the server does, for events and metrics. Calls must not block.
type Observer interface {
	// Served: a stream (or fetch) got resource e in answer to its request.
	Served(node string, e *secrets.Entry)
	// Nacked: a client rejected a response.
	Nacked(node string, names []string, version, nonce, msg string)
	// Stream: rpc opened (delta +1) or closed (delta -1).
	Stream(rpc string, delta int)
	// Asked: a client asked for names afresh (a fetch, a stream's first or changed
	// subscription), not an ACK or NACK of what it got.
	Asked(node string, names []string)
}

// Server implements the SDS gRPC service.
type Server struct {
	store *secrets.Store
	obs   Observer
	clk   clock.Clock
	log   hclog.Logger
	nonce atomic.Uint64
}

// New returns a server over store; clk times a fetch's wait for a secret not
// issued yet (FetchWait).
func New(store *secrets.Store, obs Observer, clk clock.Clock, log hclog.Logger) *Server {
	return &Server{store: store, obs: obs, clk: clk, log: log}
}

// ServerOptions are the options a gRPC server needs to serve this service: its
// messages are xdswire's, so the server must use xdswire's codec (every service
// on that server must then speak xdswire's messages).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(xdswire.Codec{})}
}

// Register adds the service to g, which must have been made with ServerOptions.
func (s *Server) Register(g *grpc.Server) { g.RegisterService(&serviceDesc, s) }

// serviceDesc is envoy.service.secret.v3.SecretDiscoveryService, as the generated
// code describes it, with handlers on xdswire's messages.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: "envoy.service.secret.v3.SecretDiscoveryService",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "FetchSecrets", Handler: func(srv any, ctx context.Context, dec func(any) error,
		in grpc.UnaryServerInterceptor) (any, error) {
		req := &xdswire.DiscoveryRequest{}
		if err := dec(req); err != nil {
			return nil, err
		}
		s := srv.(*Server)
		if in == nil {
			return s.FetchSecrets(ctx, req)
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets"}
		return in(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			return s.FetchSecrets(ctx, req.(*xdswire.DiscoveryRequest))
		})
	}}},
	Streams: []grpc.StreamDesc{
		{StreamName: "DeltaSecrets", ServerStreams: true, ClientStreams: true, Handler: func(srv any, st grpc.ServerStream) error {
			return srv.(*Server).DeltaSecrets(st)
		}},
		{StreamName: "StreamSecrets", ServerStreams: true, ClientStreams: true, Handler: func(srv any, st grpc.ServerStream) error {
			return srv.(*Server).StreamSecrets(st)
		}},
	},
	Metadata: "envoy/service/secret/v3/sds.proto",
}

func (s *Server) nextNonce() string { return strconv.FormatUint(s.nonce.Add(1), 36) }

func checkType(typeURL string) error {
	if typeURL != "" && typeURL != sdsclient.SecretTypeURL {
		return status.Errorf(codes.InvalidArgument, "type_url %q: this server only serves %q", typeURL, sdsclient.SecretTypeURL)
	}
	return nil
}

// checkNames resolves every name, failing with NotFound on the first unknown one.
func (s *Server) checkNames(names []string) error {
	for _, n := range names {
		if err := s.store.Check(n); err != nil {
			if errors.Is(err, secrets.ErrUnknown) {
				return status.Error(codes.NotFound, err.Error())
			}
			return status.Error(codes.Internal, err.Error())
		}
	}
	return nil
}

// FetchSecrets answers one request with the current value of every named resource.
func (s *Server) FetchSecrets(ctx context.Context, req *xdswire.DiscoveryRequest) (*xdswire.DiscoveryResponse, error) {
	s.obs.Stream("fetch", 1)
	defer s.obs.Stream("fetch", -1)
	node := req.NodeID
	if node == "" {
		return nil, status.Error(codes.InvalidArgument, "node id required")
	}
	if err := checkType(req.TypeURL); err != nil {
		return nil, err
	}
	if len(req.ResourceNames) == 0 {
		return nil, status.Error(codes.InvalidArgument, "resource_names required")
	}
	if err := s.checkNames(req.ResourceNames); err != nil {
		return nil, err
	}
	s.obs.Asked(node, req.ResourceNames)
	entries, err := s.await(ctx, req.ResourceNames)
	if err != nil {
		return nil, err
	}
	resp := &xdswire.DiscoveryResponse{TypeURL: sdsclient.SecretTypeURL, Nonce: s.nextNonce(), VersionInfo: versionOf(entries)}
	for _, e := range entries {
		resp.Resources = append(resp.Resources, e.Any)
		s.obs.Served(node, e)
	}
	return resp, nil
}

// FetchWait bounds how long FetchSecrets waits for a secret not issued yet (at pod
// start) when the caller set no earlier deadline.
const FetchWait = 5 * time.Second

// await returns the entries of names once every one has a value.
func (s *Server) await(ctx context.Context, names []string) ([]*secrets.Entry, error) {
	if e := s.store.Snapshot(names); len(e) == len(names) {
		return e, nil
	}
	w := s.store.NewWatch()
	defer w.Close()
	w.Set(names)
	t := s.clk.NewTimer(FetchWait)
	defer t.Stop()
	for {
		if e := s.store.Snapshot(names); len(e) == len(names) {
			return e, nil
		}
		select {
		case <-w.C():
		case <-ctx.Done():
			return nil, status.Error(codes.Unavailable, "secret not available yet")
		case <-t.C():
			return nil, status.Error(codes.Unavailable, "secret not available yet")
		}
	}
}

// versionOf is the response version of a set of entries: the newest store version.
func versionOf(entries []*secrets.Entry) string {
	var max uint64
	for _, e := range entries {
		if v, _ := strconv.ParseUint(e.Version, 10, 64); v > max {
			max = v
		}
	}
	return strconv.FormatUint(max, 10)
}

func anys(entries []*secrets.Entry) []xdswire.Any {
	out := make([]xdswire.Any, len(entries))
	for i, e := range entries {
		out[i] = e.Any
	}
	return out
}
