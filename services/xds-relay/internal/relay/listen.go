package relay

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// DefaultSocketMode is the socket's mode when Config.SocketMode is zero: only
// Envoy's user (the relay's own) may connect.
const DefaultSocketMode os.FileMode = 0o600

// maxUnixPath is the longest unix socket path the kernel takes (sun_path less its NUL).
const maxUnixPath = 107

// probeTimeout bounds the dial that tells a live socket from a stale one.
const probeTimeout = time.Second

// Listen binds a unix socket at path with file mode mode, creating its parent
// directories. The socket never exists at path with looser permissions: it is
// bound inside a private (0700) temporary directory next to path, given its mode,
// then linked into place, which fails rather than replaces if path has appeared
// meanwhile. A socket file already at path is probed first: if something answers,
// Listen refuses ("another xds-relay is serving on ..."); if nothing does, the
// stale file is removed. Anything else at path is an error and is left alone.
// The returned listener does not unlink path when closed.
func Listen(path string, mode os.FileMode) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if err := clearStale(path); err != nil {
		return nil, err
	}
	priv, err := os.MkdirTemp(dir, ".xr")
	if err != nil {
		return nil, fmt.Errorf("create temporary socket dir: %w", err)
	}
	defer os.RemoveAll(priv)
	tmp := filepath.Join(priv, "s")
	if len(tmp) > maxUnixPath {
		return nil, fmt.Errorf("socket %s: directory too long for a temporary socket (%d bytes, max %d)", path, len(tmp), maxUnixPath)
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
	// Link, not rename: rename would silently replace a socket another relay bound
	// after clearStale looked.
	if err := os.Link(tmp, path); err != nil {
		ln.Close()
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("another xds-relay is serving on %s (it appeared while binding)", path)
		}
		return nil, fmt.Errorf("place socket at %s: %w", path, err)
	}
	return ln, nil
}

// clearStale makes sure nothing is at path: it removes a socket nobody answers on
// and refuses a live socket or anything that is not a socket.
func clearStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat socket: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket (%v); not removing it", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	switch {
	case err == nil:
		c.Close()
		return fmt.Errorf("another xds-relay is serving on %s", path)
	case errors.Is(err, syscall.ECONNREFUSED):
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale socket: %w", err)
		}
		return nil
	case errors.Is(err, os.ErrNotExist):
		return nil // removed since Lstat
	default:
		return fmt.Errorf("probe existing socket %s: %w", path, err)
	}
}

// ownsSocket reports whether path is still the socket this relay linked there
// (another relay may have replaced a file removed by hand).
func ownsSocket(path string, mine os.FileInfo) bool {
	fi, err := os.Lstat(path)
	return err == nil && os.SameFile(fi, mine)
}
