package sds

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// streamHandler is one kind of SDS stream (state of the world, delta): what it
// does with a client's request and with a change of the secrets it watches.
type streamHandler[M any] interface {
	// request handles one request: a subscription, an ACK or a NACK.
	request(req M) error
	// changed sends what changed of the watched secrets, if anything did.
	changed() error
}

// serveStream runs a stream until the client or ctx ends it: rpc is counted open
// while it runs, the client's requests are read by a goroutine of their own, and
// open builds the stream's handler on the store watch it sets.
func serveStream[T any, M interface {
	*T
	xdswire.Message
}](s *Server, rpc string, stream grpc.ServerStream, open func(w *secrets.Watch) streamHandler[M]) error {
	s.obs.Stream(rpc, 1)
	defer s.obs.Stream(rpc, -1)
	ctx := stream.Context()
	reqs := make(chan M)
	errc := make(chan error, 1)
	go recvLoop(ctx, stream, reqs, errc)

	w := s.store.NewWatch()
	defer w.Close()
	h := open(w)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return streamEnd(err)
		case <-w.C():
			if err := h.changed(); err != nil {
				return err
			}
		case req := <-reqs:
			if err := h.request(req); err != nil {
				return err
			}
		}
	}
}

// recvLoop feeds a stream's requests into a channel until it ends.
func recvLoop[T any, M interface {
	*T
	xdswire.Message
}](ctx context.Context, st grpc.ServerStream, reqs chan<- M, errc chan<- error) {
	for {
		r := M(new(T))
		if err := st.RecvMsg(r); err != nil {
			errc <- err
			return
		}
		select {
		case reqs <- r:
		case <-ctx.Done():
			return
		}
	}
}

// streamEnd is what a stream returns when its client's side ended with err:
// nothing for a cancellation or the client closing it.
func streamEnd(err error) error {
	if st, ok := status.FromError(err); ok && (st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded) {
		return nil
	}
	if errors.Is(err, context.Canceled) || err.Error() == "EOF" {
		return nil
	}
	return fmt.Errorf("receive: %w", err)
}
