package sds

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/pkg/udsock"
)

// Listener serves an SDS server on a unix socket.
type Listener struct {
	path  string
	mode  os.FileMode
	srv   *Server
	log   hclog.Logger
	bound chan struct{}
}

// NewListener returns a listener for path with file mode mode. It does not listen
// until Run.
func NewListener(path string, mode os.FileMode, srv *Server, log hclog.Logger) *Listener {
	return &Listener{path: path, mode: mode, srv: srv, log: log, bound: make(chan struct{})}
}

// Bound is closed once the socket accepts connections.
func (l *Listener) Bound() <-chan struct{} { return l.bound }

// Run binds the socket (pkg/udsock: never looser than mode, never over a live
// socket) and serves until ctx ends, then closes every stream and removes the
// socket if it is still its own.
func (l *Listener) Run(ctx context.Context) error {
	ln, err := udsock.Listen(l.path, l.mode)
	if err != nil {
		return err
	}
	g := grpc.NewServer(append(ServerOptions(), grpc.MaxConcurrentStreams(1<<16))...)
	l.srv.Register(g)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(ln) }()
	close(l.bound)
	l.log.Info("sds listening", "socket", l.path, "mode", fmt.Sprintf("%#o", l.mode))
	select {
	case err = <-errc:
	case <-ctx.Done():
		// Streams never end by themselves: Stop closes them (Envoy reconnects).
		g.Stop()
		err = <-errc
	}
	_ = ln.Close() // removes the socket file; Serve's own Close may have already
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve sds: %w", err)
	}
	return nil
}
