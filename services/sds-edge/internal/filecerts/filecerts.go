// Package filecerts serves certificates read from files: the pod's mounted
// credentials (as `default` and `ROOTCA`) and the file-cert:/file-root: resources.
// It watches the files' directories, so Kubernetes' ..data symlink swaps are seen,
// and reloads after a quiet (debounce) period.
package filecerts

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// Changed hears about every stored change.
type Changed func(e *secrets.Entry, streams int)

// source is one resource and the files it is read from.
type source struct {
	name            string
	cert, key, root string
	// confined: the files must resolve (symlinks, "..") to a path under one of
	// the roots, checked at every load. Set for the resources Envoy names
	// (Resolve), whose paths come from whoever writes the proxy's configuration.
	confined bool
	roots    []string
}

// Files loads and watches file-backed resources.
type Files struct {
	store    *secrets.Store
	under    func(string) string
	roots    []string // where file-cert:/file-root: may read (absolute)
	debounce time.Duration
	changed  Changed
	clk      clock.Clock
	log      hclog.Logger

	mu      sync.Mutex
	sources map[string]source
	dirs    map[string]bool
	w       *fsnotify.Watcher // set by Run
}

var _ secrets.Resolver = (*Files)(nil)

// New returns a loader; under resolves relative paths (under the pod root). roots
// are the directories file-cert:/file-root: resources may be read from (absolute
// paths; none: every such resource is refused). Mount, AddCert and AddRoots, whose
// paths come from sds-edge's own configuration, are not confined. The debounce
// is timed on clk.
func New(store *secrets.Store, under func(string) string, roots []string, debounce time.Duration, changed Changed, clk clock.Clock, log hclog.Logger) *Files {
	return &Files{store: store, under: under, roots: roots, debounce: debounce, changed: changed, clk: clk, log: log,
		sources: map[string]source{}, dirs: map[string]bool{}}
}

// Mount serves dir's cert-chain.pem and key.pem as `default` and its root-cert.pem
// (if present) as `ROOTCA`.
func (f *Files) Mount(dir string) error {
	if err := f.add(source{name: secrets.Default, cert: filepath.Join(dir, "cert-chain.pem"), key: filepath.Join(dir, "key.pem")}); err != nil {
		return err
	}
	root := filepath.Join(dir, "root-cert.pem")
	if _, err := os.Stat(root); err == nil {
		return f.add(source{name: secrets.RootCA, root: root})
	}
	return nil
}

// Resolve loads and watches a file-cert:<cert>~<key> or file-root:<path> resource.
// The names come from the proxy's configuration (a DestinationRule's or a
// Gateway's file paths, written by whoever may write those), so the files must lie
// in one of the loader's roots once ".." and symlinks are resolved: a name for
// any other file is refused, without saying whether it exists.
func (f *Files) Resolve(name string) error {
	var s source
	switch {
	case strings.HasPrefix(name, secrets.FileCertPrefix):
		cert, key, ok := strings.Cut(strings.TrimPrefix(name, secrets.FileCertPrefix), "~")
		if !ok || cert == "" || key == "" {
			return errors.New("want file-cert:<cert-path>~<key-path>")
		}
		s = source{name: name, cert: f.under(cert), key: f.under(key), confined: true, roots: f.roots}
	case strings.HasPrefix(name, secrets.FileRootPrefix):
		p := strings.TrimPrefix(name, secrets.FileRootPrefix)
		if p == "" {
			return errors.New("want file-root:<path>")
		}
		s = source{name: name, root: f.under(p), confined: true, roots: f.roots}
	default:
		return errors.New("not a file resource")
	}
	return f.add(s)
}

// AddCert loads a certificate chain and its key from files and serves them as name,
// reloading when the files' directories change. The paths are used as given.
func (f *Files) AddCert(name, cert, key string) error {
	return f.add(source{name: name, cert: cert, key: key})
}

// AddRoots loads PEM roots from a file and serves them as name (a validation
// context), reloading when the file's directory changes. The path is used as given.
func (f *Files) AddRoots(name, path string) error {
	return f.add(source{name: name, root: path})
}

func (f *Files) add(s source) error {
	sec, err := load(s)
	if err != nil {
		return err
	}
	f.mu.Lock()
	if _, ok := f.sources[s.name]; ok {
		f.mu.Unlock()
		return nil
	}
	f.sources[s.name] = s
	for _, p := range []string{s.cert, s.key, s.root} {
		if p == "" {
			continue
		}
		d := filepath.Dir(p)
		if !f.dirs[d] {
			f.dirs[d] = true
			if f.w != nil {
				if err := f.w.Add(d); err != nil {
					f.log.Warn("cannot watch directory", "dir", d, "error", err)
				}
			}
		}
	}
	f.mu.Unlock()
	f.set(sec)
	return nil
}

func (f *Files) set(sec sdsclient.Secret) {
	e, n := f.store.Set(sec)
	if f.changed != nil {
		f.changed(e, n)
	}
}

// load reads a source and checks it: a key that matches its certificate, or roots
// that parse. A confined source's files are read where they resolve to, once
// checked.
func load(s source) (sdsclient.Secret, error) {
	read := os.ReadFile
	if s.confined {
		read = func(p string) ([]byte, error) {
			real, err := confine(p, s.roots)
			if err != nil {
				return nil, err
			}
			return os.ReadFile(real)
		}
	}
	if s.root != "" {
		data, err := read(s.root)
		if err != nil {
			return sdsclient.Secret{}, err
		}
		if certs, err := pki.ParseCertsPEM(data); err != nil || len(certs) == 0 {
			return sdsclient.Secret{}, fmt.Errorf("%s: no certificates: %v", s.root, err)
		}
		return sdsclient.Secret{Name: s.name, TrustedCA: data}, nil
	}
	chain, err := read(s.cert)
	if err != nil {
		return sdsclient.Secret{}, err
	}
	key, err := read(s.key)
	if err != nil {
		return sdsclient.Secret{}, err
	}
	if _, err := tls.X509KeyPair(chain, key); err != nil {
		return sdsclient.Secret{}, fmt.Errorf("%s and %s: %w", s.cert, s.key, err)
	}
	return sdsclient.Secret{Name: s.name, CertChain: chain, PrivateKey: key}, nil
}

// Run watches the directories until ctx ends and reloads every source after each
// burst of changes. It returns nil on cancellation.
func (f *Files) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch files: %w", err)
	}
	defer w.Close()
	f.mu.Lock()
	f.w = w
	for d := range f.dirs {
		if err := w.Add(d); err != nil {
			f.log.Warn("cannot watch directory", "dir", d, "error", err)
		}
	}
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.w = nil; f.mu.Unlock() }()
	f.reload() // catch changes made before the watch began

	// The debounce: each change (re)arms the timer, stopped until the first.
	timer := f.clk.NewTimer(f.debounce)
	timer.Stop()
	defer timer.Stop()
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			f.log.Trace("file event", "name", ev.Name, "op", ev.Op.String())
			timer.Reset(f.debounce)
			fire = timer.C()
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			f.log.Warn("file watch error", "error", err)
		case <-fire:
			fire = nil
			f.reload()
		}
	}
}

// reload re-reads every source; a source that does not load keeps its old value.
func (f *Files) reload() {
	f.mu.Lock()
	srcs := make([]source, 0, len(f.sources))
	for _, s := range f.sources {
		srcs = append(srcs, s)
	}
	f.mu.Unlock()
	for _, s := range srcs {
		sec, err := load(s)
		if err != nil {
			f.log.Warn("keeping previous secret: files do not load", "resource", s.name, "error", err)
			continue
		}
		if old, ok := f.store.Get(s.name); ok {
			if e, n := f.store.Set(sec); e != old && f.changed != nil {
				f.log.Info("file secret changed", "resource", s.name, "version", e.Version)
				f.changed(e, n)
			}
			continue
		}
		f.set(sec)
	}
}
