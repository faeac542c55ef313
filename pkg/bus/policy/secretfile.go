package policy

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
)

// ErrSecretMode is returned for a secret file others could read or change.
var ErrSecretMode = errors.New("secret file too open")

// OpenSecret opens a secret file (an nkey seed, the CA's key-encryption key) and
// checks, on the open file, that only its owner can read it, or also its group
// when that group is one of this process's own (effective or supplementary) and
// may only read: that is how Kubernetes mounts a Secret for a non-root container
// (root-owned, defaultMode 0440, group = the pod's fsGroup). World access, group
// write, and group read by a group the process is not in are refused.
func OpenSecret(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = checkSecret(path, fi, fileGID(fi), processGIDs())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReadSecret reads a secret file checked by OpenSecret, at most limit bytes
// (a larger file is an error).
func ReadSecret(path string, limit int64) ([]byte, error) {
	f, err := OpenSecret(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return data, nil
}

// checkSecret is OpenSecret's rule for a file of group gid (-1: unknown) read by
// a process in groups.
func checkSecret(path string, fi fs.FileInfo, gid int, groups []int) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file", ErrSecretMode, path)
	}
	perm := fi.Mode().Perm()
	switch {
	case perm&0o007 != 0:
		return fmt.Errorf("%w: %s has mode %04o: others may access it (chmod 600; in Kubernetes defaultMode 0400, or 0440 with an fsGroup)", ErrSecretMode, path, perm)
	case perm&0o070 == 0:
		return nil
	case perm&0o030 != 0:
		return fmt.Errorf("%w: %s has mode %04o: its group may write or execute it (chmod 600, or 640 for a group of this process)", ErrSecretMode, path, perm)
	case gid < 0 || !slices.Contains(groups, gid):
		return fmt.Errorf("%w: %s has mode %04o and its group %d is not one of this process's (%v): chmod 600, or give it this process's group", ErrSecretMode, path, perm, gid, groups)
	}
	return nil
}
