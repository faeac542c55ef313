// Package certdir is the layout of Istio's OUTPUT_CERTS directory: key.pem (0600),
// cert-chain.pem and root-cert.pem, written as one set. sds-edge keeps a pod's
// directory current with it; meshctl sign -out writes one; meshctl status reads
// them by these names.
package certdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// File names, as Istio's agent writes them.
const (
	KeyFile   = "key.pem"
	ChainFile = "cert-chain.pem"
	RootFile  = "root-cert.pem"
)

// DataLink is the symbolic link in the directory naming the current set's
// directory; each file name is a link through it (Kubernetes' AtomicWriter
// layout, which readers of mounted Secrets already handle).
const DataLink = "..data"

var writing sync.Mutex

// setPrefix begins the name of every set's directory.
const setPrefix = "..certs-"

// Write replaces the three files in dir (made 0755 if missing) as one set: it
// writes them, with their final modes, into a new directory of dir, then swaps
// DataLink to it with one rename, and removes the sets before. key.pem,
// cert-chain.pem and root-cert.pem are links through DataLink, so a reader that
// opens one sees the new file or the old one; a reader that must see one set
// across its three opens resolves DataLink once (os.Readlink) and reads the
// files in that directory, which is never changed once linked and is kept until
// the write after the next (a reader that finds it gone resolves again). Empty
// data is refused: the directory keeps the set it has.
func Write(dir string, keyPEM, chainPEM, rootsPEM []byte) error {
	// One writer at a time in this process: another's cleanup must not remove a
	// set being written.
	writing.Lock()
	defer writing.Unlock()
	if len(keyPEM) == 0 || len(chainPEM) == 0 || len(rootsPEM) == 0 {
		return errors.New("output certs: refusing to write an empty key, chain or roots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	set, err := os.MkdirTemp(dir, setPrefix)
	if err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	if err := os.Chmod(set, 0o755); err != nil {
		return errors.Join(fmt.Errorf("output dir: %w", err), os.RemoveAll(set))
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{RootFile, rootsPEM, 0o644}, {ChainFile, chainPEM, 0o644}, {KeyFile, keyPEM, 0o600}} {
		if err := writeSynced(filepath.Join(set, f.name), f.data, f.mode); err != nil {
			return errors.Join(err, os.RemoveAll(set))
		}
	}
	prev, _ := os.Readlink(filepath.Join(dir, DataLink))
	if err := swapLink(dir, DataLink, filepath.Base(set)); err != nil {
		return errors.Join(err, os.RemoveAll(set))
	}
	for _, name := range []string{RootFile, ChainFile, KeyFile} {
		target := filepath.Join(DataLink, name)
		if cur, err := os.Readlink(filepath.Join(dir, name)); err == nil && cur == target {
			continue
		}
		// A regular file of the layout before (or nothing): replaced by the link
		// at once, by rename.
		if err := swapLink(dir, name, target); err != nil {
			return err
		}
	}
	return removeOldSets(dir, filepath.Base(set), prev)
}

// writeSynced writes a new file with its mode from the start and syncs it.
func writeSynced(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // whatever the umask took away
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// swapLink points dir/name at target with one rename of a new link.
func swapLink(dir, name, target string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return errors.Join(fmt.Errorf("link %s: %w", name, err), os.Remove(tmp))
	}
	return nil
}

// removeOldSets removes every set directory but keep: the one linked now and the
// one before it, which a reader may still be reading.
func removeOldSets(dir string, keep ...string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, setPrefix) && !slices.Contains(keep, n) {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, n)))
		}
	}
	return errors.Join(errs...)
}
