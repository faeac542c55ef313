package identity

import (
	"crypto/x509"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
)

// trust is the set of roots ROOTCA serves: the CA's bundle (kept across changes
// until each root expires or is said to be removed, so old and new roots are served
// together while both are valid), which only an endorsed bundle changes, plus this
// pod's extra anchors from its relay. The extra anchors are served, never trusted to
// endorse a bundle or to validate a CA leaf.
type trust struct {
	ca      *trustbundle.Set
	anchors []*x509.Certificate
}

// setAnchors replaces the extra anchors; it reports whether they changed.
func (t *trust) setAnchors(roots []*x509.Certificate) bool {
	if len(roots) == len(t.anchors) {
		same := true
		for i := range roots {
			if !roots[i].Equal(t.anchors[i]) {
				same = false
			}
		}
		if same {
			return false
		}
	}
	t.anchors = roots
	return true
}

// pem returns every current root, CA roots newest first then anchors, without
// duplicates or expired certificates.
func (t *trust) pem(now time.Time) []byte {
	certs := t.ca.Roots()
	seen := map[string]bool{}
	for _, c := range certs {
		seen[pki.Fingerprint(c)] = true
	}
	for _, a := range t.anchors {
		if fp := pki.Fingerprint(a); !seen[fp] && !now.After(a.NotAfter) {
			seen[fp] = true
			certs = append(certs, a)
		}
	}
	return pki.EncodeCertsPEM(certs)
}
