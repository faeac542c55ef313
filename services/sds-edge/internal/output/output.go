// Package output writes the pod's key, chain and roots to a directory (Istio's
// OUTPUT_CERTS), atomically on every change.
package output

import (
	"fmt"
	"os"
	"path/filepath"
)

// File names, as Istio's agent writes them.
const (
	KeyFile   = "key.pem"
	ChainFile = "cert-chain.pem"
	RootFile  = "root-cert.pem"
)

// Writer writes into one directory.
type Writer struct{ dir string }

// New returns a writer for dir.
func New(dir string) *Writer { return &Writer{dir: dir} }

// Write replaces the three files. Each is written to a temporary file with its final
// mode (key 0600, others 0644), synced and renamed, so a reader sees the old file or
// the new one, never a partial one.
func (w *Writer) Write(keyPEM, chainPEM, rootsPEM []byte) error {
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{RootFile, rootsPEM, 0o644}, {ChainFile, chainPEM, 0o644}, {KeyFile, keyPEM, 0o600}} {
		if err := atomicWrite(filepath.Join(w.dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

func atomicWrite(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
