// Package grpcserve runs a gRPC server for as long as a context lives and then
// stops it within a bound: the one "serve, then graceful stop" every meshagent gRPC
// listener (the signer's CA, the xDS relay, the demo control plane) shares.
package grpcserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
)

// Serve serves srv on ln until ctx ends, then stops it gracefully, waiting at most
// grace for open RPCs to finish before closing them. It returns nil after a stop
// that ctx asked for, and Serve's error when serving ends by itself first.
// Streams that never end on their own (ADS, SDS) need grace or a way of their own
// to end: context.AfterFunc(ctx, ...) before calling Serve is the place for it.
func Serve(ctx context.Context, srv *grpc.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		if err == nil {
			err = grpc.ErrServerStopped
		}
		return fmt.Errorf("serve grpc on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	gctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	select {
	case <-done:
	case <-gctx.Done():
		srv.Stop()
		<-done
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve grpc on %s: %w", ln.Addr(), err)
	}
	return nil
}
