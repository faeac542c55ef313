package identity

import (
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
)

// trust is the set of roots ROOTCA serves: the CA's bundle (kept across changes
// until each root expires or is said to be removed, so old and new roots are served
// together while both are valid), which only an endorsed bundle changes, plus the
// roots of the named signer this pod asked for, as the mesh CA last endorsed them
// with its certificate, plus this pod's extra anchors from its relay. The signer's
// roots and the extra anchors are served, never trusted to endorse a bundle; only
// the signer's validate the pod's own leaf, and only in the reply they came with.
type trust struct {
	ca      *trustbundle.Set
	signer  []*x509.Certificate
	anchors []*x509.Certificate
}

// setAnchors replaces the extra anchors; it reports whether they changed.
func (t *trust) setAnchors(roots []*x509.Certificate) bool {
	if slices.EqualFunc(roots, t.anchors, (*x509.Certificate).Equal) {
		return false
	}
	t.anchors = roots
	return true
}

// setSigner replaces the named signer's roots; it reports whether they changed.
func (t *trust) setSigner(roots []*x509.Certificate) bool {
	if slices.EqualFunc(roots, t.signer, (*x509.Certificate).Equal) {
		return false
	}
	t.signer = roots
	return true
}

// pem returns every current root, CA roots newest first, then the named signer's,
// then anchors, without duplicates or expired certificates.
func (t *trust) pem(now time.Time) []byte {
	certs := t.ca.Roots()
	seen := map[string]bool{}
	for _, c := range certs {
		seen[pki.Fingerprint(c)] = true
	}
	for _, a := range slices.Concat(t.signer, t.anchors) {
		if fp := pki.Fingerprint(a); !seen[fp] && !now.After(a.NotAfter) {
			seen[fp] = true
			certs = append(certs, a)
		}
	}
	return pki.EncodeCertsPEM(certs)
}

// TrustChanged applies a trust.changed event: see ApplyBundle.
func (m *Manager) TrustChanged(ev events.TrustChanged) error {
	return m.ApplyBundle(SourceTrustChanged, trustbundle.FromTrustChanged(ev))
}

// ApplyBundle applies a trust bundle from source (trust.changed or a bundle
// reply) when one of its endorsements verifies under a root the pod trusts now,
// and pushes ROOTCA if the roots changed. Stale news (an older generation) changes
// nothing and is no error; a bundle that does not verify is counted and refused,
// and changes nothing either. Before the first bundle, a trust.changed is not
// trusted on first use: the signer's own reply is.
func (m *Manager) ApplyBundle(source string, b trustbundle.Bundle) error {
	if source == SourceTrustChanged && !m.trust.ca.Bootstrapped() && m.trust.ca.Mode() == trustbundle.FirstUse {
		m.log.Debug("trust.changed before the first bundle ignored", "generation", b.Generation)
		return nil
	}
	u, err := m.trust.ca.Check(b)
	if err != nil {
		m.obs.TrustRejected(source)
		return fmt.Errorf("%s: %w", source, err)
	}
	if m.apply(u) {
		m.publish(false, true)
	}
	return nil
}

// apply installs a checked bundle update; it reports whether the roots changed.
// The first one is logged, at WARN when it was trusted on first use.
func (m *Manager) apply(u trustbundle.Update) bool {
	changed := m.trust.ca.Apply(u)
	if m.trust.ca.Bootstrapped() {
		m.bootOnce.Do(func() {
			mode := m.trust.ca.Mode()
			fps := make([]string, 0, len(u.Roots))
			for _, r := range u.Roots {
				fps = append(fps, pki.Fingerprint(r))
			}
			if mode == trustbundle.FirstUse {
				m.log.Warn("trusting the first trust bundle on first use: no trust anchors configured (-trust-anchors-file)",
					"roots", fps, "generation", u.Generation)
			} else {
				m.log.Info("first trust bundle verified against the trust anchors", "roots", fps, "generation", u.Generation, "endorser", u.Endorser)
			}
			m.obs.TrustBootstrapped(string(mode))
		})
	}
	return changed
}

// Roots returns the CA roots, to verify a gRPC CA's TLS: the trusted bundle, or
// before the first one the anchors; nil when there are neither.
func (m *Manager) Roots() *x509.CertPool {
	if m.trust.ca.Bootstrapped() || len(m.cfg.Anchors) == 0 {
		return m.trust.ca.Pool()
	}
	p := x509.NewCertPool()
	for _, a := range m.cfg.Anchors {
		p.AddCert(a)
	}
	return p
}

// SetAnchors applies this pod's extra trust anchors.
func (m *Manager) SetAnchors(ev events.TrustAnchors) error {
	roots, err := pki.ParseCertPEMs(ev.Roots)
	if err != nil {
		return fmt.Errorf("trust anchors: %w", err)
	}
	m.mu.Lock()
	changed := m.trust.setAnchors(roots)
	m.mu.Unlock()
	if changed {
		m.publish(false, true)
	}
	return nil
}
