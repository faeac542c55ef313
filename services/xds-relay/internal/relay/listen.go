package relay

import (
	"errors"
	"fmt"
	"os"

	"github.com/meshagent/meshagent/pkg/udsock"
)

// DefaultSocketMode is the socket's mode when Config.SocketMode is zero: only
// Envoy's user (the relay's own) may connect.
const DefaultSocketMode os.FileMode = 0o600

// Listen binds the relay's unix socket at path with file mode mode (pkg/udsock:
// bound privately then linked into place, never over a live socket, a stale one
// replaced). A live socket is refused with "another xds-relay is serving on
// <path>". Closing the listener removes the socket while it is still its own.
func Listen(path string, mode os.FileMode) (*udsock.Listener, error) {
	ln, err := udsock.Listen(path, mode)
	var inUse *udsock.InUseError
	if errors.As(err, &inUse) {
		if inUse.Late {
			return nil, fmt.Errorf("another xds-relay is serving on %s (it appeared while binding)", path)
		}
		return nil, fmt.Errorf("another xds-relay is serving on %s", path)
	}
	return ln, err
}
