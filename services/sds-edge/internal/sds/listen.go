package sds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
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

// Listen creates the socket with its parent directories. The socket is bound under a
// temporary name, given its mode, then renamed into place, so no client ever sees it
// with looser permissions.
func Listen(path string, mode os.FileMode) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+strconv.Itoa(os.Getpid())+".sds.tmp")
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("place socket: %w", err)
	}
	return ln, nil
}

// Run serves until ctx ends, then closes every stream and removes the socket.
func (l *Listener) Run(ctx context.Context) error {
	ln, err := Listen(l.path, l.mode)
	if err != nil {
		return err
	}
	g := grpc.NewServer(grpc.MaxConcurrentStreams(1 << 16))
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
	_ = os.Remove(l.path)
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve sds: %w", err)
	}
	return nil
}
