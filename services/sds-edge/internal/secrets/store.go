// Package secrets is sds-edge's secret cache: the current value of every SDS resource,
// a version per change, and watches that wake only the streams watching what changed.
package secrets

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
)

// Resource names.
const (
	Default = sdsclient.ResourceDefault
	RootCA  = sdsclient.ResourceRootCA
	// FileCertPrefix names a certificate read from files: file-cert:<cert>~<key>.
	FileCertPrefix = "file-cert:"
	// FileRootPrefix names roots read from a file: file-root:<path>.
	FileRootPrefix = "file-root:"
)

// ErrUnknown is returned for a resource name sds-edge does not serve.
var ErrUnknown = errors.New("unknown resource")

// Resolver makes a dynamic resource (file-cert:, file-root:) available, loading it and
// watching it for changes. It returns an error when it cannot.
type Resolver interface {
	Resolve(name string) error
}

// Entry is the current value of one resource.
type Entry struct {
	Name     string
	Version  string
	Any      xdswire.Any // the encoded Secret
	Serial   string      // leaf serial of a certificate resource
	NotAfter time.Time   // earliest expiry among its certificates
}

// Names says which resource names a store serves: fixed names, set by their owner
// and never resolved, and names with a dynamic prefix, made available on first ask
// by the store's Resolver. Any other name is unknown.
type Names struct {
	Fixed    []string
	Prefixes []string
	// Want describes the accepted names in errors ("want ...").
	Want string
}

// WorkloadNames are the names of the workload SDS server: `default`, `ROOTCA` and
// the file-cert:/file-root: resources.
var WorkloadNames = Names{
	Fixed:    []string{Default, RootCA, SPIFFERootCA},
	Prefixes: []string{FileCertPrefix, FileRootPrefix},
	Want:     fmt.Sprintf("%q, %q, %q, %s<cert>~<key> or %s<path>", Default, RootCA, SPIFFERootCA, FileCertPrefix, FileRootPrefix),
}

// Store holds every resource. It is safe for concurrent use.
type Store struct {
	names    Names
	mu       sync.RWMutex
	gen      uint64
	entries  map[string]*Entry
	watches  map[*Watch]struct{}
	resolver Resolver
}

// New returns an empty store of the workload's names (WorkloadNames). resolver may
// be nil (no file resources).
func New(resolver Resolver) *Store { return NewFor(WorkloadNames, resolver) }

// NewFor returns an empty store that serves names, resolving dynamic ones with
// resolver (nil: none).
func NewFor(names Names, resolver Resolver) *Store {
	return &Store{names: names, entries: map[string]*Entry{}, watches: map[*Watch]struct{}{}, resolver: resolver}
}

// SetResolver sets the resolver of dynamic names.
func (s *Store) SetResolver(r Resolver) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resolver = r
}

// Check reports whether name can be served, resolving dynamic names. Unknown names
// wrap ErrUnknown.
func (s *Store) Check(name string) error {
	if slices.Contains(s.names.Fixed, name) {
		return nil
	}
	if !slices.ContainsFunc(s.names.Prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
		return fmt.Errorf("%w %q: want %s", ErrUnknown, name, s.names.Want)
	}
	s.mu.RLock()
	_, ok := s.entries[name]
	r := s.resolver
	s.mu.RUnlock()
	if ok {
		return nil
	}
	if r == nil {
		return fmt.Errorf("%w %q: file resources are not enabled", ErrUnknown, name)
	}
	if err := r.Resolve(name); err != nil {
		return fmt.Errorf("%w %q: %v", ErrUnknown, name, err)
	}
	return nil
}

// Set stores sec under its name with a new version and wakes every watch on it. It
// returns the new entry and how many watches were woken. An identical value is not a
// change: it returns the current entry and 0.
func (s *Store) Set(sec sdsclient.Secret) (*Entry, int) {
	e := &Entry{Name: sec.Name, Any: sec.Any()}
	pemData := sec.CertChain
	if len(pemData) == 0 {
		pemData = sec.TrustedCA
	}
	if certs := parseAll(pemData); len(certs) > 0 {
		if len(sec.CertChain) > 0 {
			e.Serial = certs[0].SerialNumber.Text(16)
		}
		e.NotAfter = certs[0].NotAfter
		for _, c := range certs[1:] {
			if c.NotAfter.Before(e.NotAfter) {
				e.NotAfter = c.NotAfter
			}
		}
	}
	return s.put(e)
}

// put stores e (Name and Any set) with a new version and wakes every watch on it,
// unless the value is the current one: then it returns the current entry and 0.
func (s *Store) put(e *Entry) (*Entry, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.entries[e.Name]; ok && string(old.Any.Value) == string(e.Any.Value) {
		return old, 0
	}
	s.gen++
	e.Version = strconv.FormatUint(s.gen, 10)
	s.entries[e.Name] = e
	n := 0
	for w := range s.watches {
		if w.names[e.Name] {
			n++
			select {
			case w.c <- struct{}{}:
			default:
			}
		}
	}
	return e, n
}

func parseAll(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for len(data) > 0 {
		var der []byte
		der, data = nextCert(data)
		if der == nil {
			break
		}
		if c, err := x509.ParseCertificate(der); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// Get returns the current entry of name.
func (s *Store) Get(name string) (*Entry, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.entries[name]
	return e, ok
}

// Snapshot returns the current entries of names that have a value.
func (s *Store) Snapshot(names []string) []*Entry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Entry, 0, len(names))
	for _, n := range names {
		if e, ok := s.entries[n]; ok {
			out = append(out, e)
		}
	}
	return out
}

// All returns every entry, for metrics.
func (s *Store) All() []*Entry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e)
	}
	return out
}

// Watch wakes its owner when a watched resource changes.
type Watch struct {
	s     *Store
	c     chan struct{}
	names map[string]bool // guarded by s.mu
}

// NewWatch returns a watch on nothing yet.
func (s *Store) NewWatch() *Watch {
	w := &Watch{s: s, c: make(chan struct{}, 1), names: map[string]bool{}}
	s.mu.Lock()
	s.watches[w] = struct{}{}
	s.mu.Unlock()
	return w
}

// C is signalled (coalesced) when a watched resource changes.
func (w *Watch) C() <-chan struct{} { return w.c }

// Set replaces the watched names.
func (w *Watch) Set(names []string) {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	w.s.mu.Lock()
	w.names = m
	w.s.mu.Unlock()
}

// Close removes the watch.
func (w *Watch) Close() {
	w.s.mu.Lock()
	delete(w.s.watches, w)
	w.s.mu.Unlock()
}

// Watching counts the watches on name.
func (s *Store) Watching(name string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for w := range s.watches {
		if w.names[name] {
			n++
		}
	}
	return n
}
