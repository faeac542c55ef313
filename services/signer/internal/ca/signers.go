package ca

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// signerReload is how long a named signer's material is used before its directory
// is read again: replacing the files takes effect within it, without a restart.
const signerReload = 10 * time.Second

// NamedSigners holds the CA material of Istio's named cert signers (CERT_SIGNERS,
// chosen by a request's CertSigner metadata): each its own cacerts directory
// <dir>/<name>/ with Istio's file names (ca-cert.pem, ca-key.pem, cert-chain.pem,
// root-cert.pem). A signer's material is read on first use and again every
// signerReload; material that turns invalid keeps the last good one in use.
type NamedSigners struct {
	dir   string
	names []string

	mu    sync.Mutex
	cache map[string]namedEntry
}

type namedEntry struct {
	mat    *Material
	readAt time.Time
}

// NewNamedSigners returns the signers names, read from dir ("" : none has material).
func NewNamedSigners(dir string, names []string) *NamedSigners {
	return &NamedSigners{dir: dir, names: slices.Clone(names), cache: map[string]namedEntry{}}
}

// Dir is the directory of signer name's material.
func (n *NamedSigners) Dir(name string) string { return filepath.Join(n.dir, name) }

// Material returns signer name's CA material at now, or why there is none: the name
// is not allowed, no directory is configured, or its material is missing or invalid.
func (n *NamedSigners) Material(name string, now time.Time) (*Material, error) {
	if !slices.Contains(n.names, name) || name == "." || name == ".." || filepath.Base(name) != name {
		return nil, fmt.Errorf("cert signer %q is not allowed (CERT_SIGNERS: %q)", name, n.names)
	}
	if n.dir == "" {
		return nil, fmt.Errorf("cert signer %q has no CA material: no -cert-signers-dir (or -cacerts-dir) is set", name)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.cache[name]
	if ok && now.Sub(e.readAt) < signerReload {
		return e.mat, nil
	}
	m, err := LoadDir(n.Dir(name), now)
	if err != nil {
		if ok && now.Before(e.mat.NotAfter()) {
			n.cache[name] = namedEntry{mat: e.mat, readAt: now}
			return e.mat, nil
		}
		return nil, fmt.Errorf("cert signer %q: CA material in %s: %w", name, n.Dir(name), err)
	}
	n.cache[name] = namedEntry{mat: m, readAt: now}
	return m, nil
}
