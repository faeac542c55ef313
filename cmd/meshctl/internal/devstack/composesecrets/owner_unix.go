//go:build unix

package composesecrets

import (
	"fmt"
	"os"
	"syscall"
)

// ownerOf returns a chown to the owner of dir (a host directory bind-mounted into
// the generator, which runs as root).
func ownerOf(dir string) (func(string) error, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return sameOwner, nil
	}
	uid, gid := int(st.Uid), int(st.Gid)
	return func(path string) error {
		if err := os.Lchown(path, uid, gid); err != nil {
			return fmt.Errorf("give %s to %d:%d: %w", path, uid, gid, err)
		}
		return nil
	}, nil
}
