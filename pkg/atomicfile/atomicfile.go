// Package atomicfile replaces a file so that a reader sees the old content or the
// new, never a part, and the new file has exactly the mode asked for from its first
// byte: a key written 0600 is never readable by others, not even for a moment, and
// a file left by an earlier run with a looser mode does not keep it. Token files,
// Istio's OUTPUT_CERTS, stack.json and the compose secrets are all written this way.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data at mode: a temporary file in the same directory
// (unique, so that two writers do not share it), chmod, write, fsync, rename. The
// directory must exist. On error path is unchanged and no temporary file is left.
func Write(path string, data []byte, mode os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
