// Package udsock listens on a unix socket safely, for the sockets a pod's proxy
// connects to (sds-edge's SDS socket, xds-relay's xDS socket): the socket never
// appears at its path with looser permissions than asked, a live socket is never
// taken over, a stale one (its server killed) is replaced, and on shutdown the
// path is removed only if it still holds this socket.
package udsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// maxPath is the longest unix socket path the kernel takes (sun_path less its NUL).
const maxPath = 107

// probeTimeout bounds the dial that tells a live socket from a stale one.
const probeTimeout = time.Second

// ErrInUse is wrapped by Listen's error when something answers on the path.
var ErrInUse = errors.New("socket in use")

// InUseError says a server already answers on Path; Late when it appeared while
// Listen was binding. It matches ErrInUse.
type InUseError struct {
	Path string
	Late bool
}

func (e *InUseError) Error() string {
	if e.Late {
		return fmt.Sprintf("another server is serving on %s (it appeared while binding)", e.Path)
	}
	return "another server is serving on " + e.Path
}

// Is makes errors.Is(err, ErrInUse) true.
func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// Live reports whether something accepts connections on path. A path that does
// not exist, or a socket nobody answers on, is not live; a path that is not a
// socket is an error.
func Live(ctx context.Context, path string) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat socket: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return false, fmt.Errorf("%s exists and is not a socket (%v); not removing it", path, fi.Mode().Type())
	}
	dctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "unix", path)
	switch {
	case err == nil:
		c.Close()
		return true, nil
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, os.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("probe existing socket %s: %w", path, err)
	}
}

// Listener is a unix socket listener bound by Listen. Closing it (gRPC's Stop
// does) removes the socket file, unless another socket has taken the path since.
type Listener struct {
	*net.UnixListener
	path string
	mine os.FileInfo
	once sync.Once
}

// Listen binds a unix socket at path with file mode mode, creating its parent
// directories (0755). The socket is bound inside a private (0700) temporary
// directory next to path, given its mode, then hard-linked into place, which
// fails rather than replaces if path has appeared meanwhile. A socket already at
// path is probed first: a live one is refused (an *InUseError, errors.Is
// ErrInUse), a stale one is removed. Anything else at path is an error and is
// left alone.
func Listen(path string, mode os.FileMode) (*Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if err := clearStale(path); err != nil {
		return nil, err
	}
	priv, err := os.MkdirTemp(dir, ".uds")
	if err != nil {
		return nil, fmt.Errorf("create temporary socket dir: %w", err)
	}
	defer os.RemoveAll(priv)
	tmp := filepath.Join(priv, "s")
	if len(tmp) > maxPath {
		return nil, fmt.Errorf("socket %s: directory too long for a temporary socket (%d bytes, max %d)", path, len(tmp), maxPath)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	// Link, not rename: rename would silently replace a socket another server
	// bound after clearStale looked.
	if err := os.Link(tmp, path); err != nil {
		ln.Close()
		if errors.Is(err, os.ErrExist) {
			return nil, &InUseError{Path: path, Late: true}
		}
		return nil, fmt.Errorf("place socket at %s: %w", path, err)
	}
	mine, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("stat bound socket: %w", err)
	}
	return &Listener{UnixListener: ln, path: path, mine: mine}, nil
}

// Path is where the socket is.
func (l *Listener) Path() string { return l.path }

// Close stops accepting and removes the socket file if it is still this one.
// Only the first call removes.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.mine) {
			_ = os.Remove(l.path)
		}
	})
	return err
}

// clearStale makes sure nothing is at path: it removes a socket nobody answers
// on and refuses a live socket or anything that is not a socket.
func clearStale(path string) error {
	live, err := Live(context.Background(), path)
	switch {
	case err != nil:
		return err
	case live:
		return &InUseError{Path: path}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}
