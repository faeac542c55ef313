package identity

import (
	"crypto/x509"
	"sort"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
)

// trust is the set of roots ROOTCA serves: the CA's bundle (kept across changes
// until each root expires or is said to be removed, so old and new roots are served
// together while both are valid) plus this pod's extra anchors.
type trust struct {
	ca      map[string]*x509.Certificate // by fingerprint
	order   map[string]int               // first-seen order, newest highest
	seq     int
	anchors []*x509.Certificate
	gen     uint64 // last trust.changed generation applied
}

func newTrust() *trust { return &trust{ca: map[string]*x509.Certificate{}, order: map[string]int{}} }

// addCA merges roots into the CA bundle and drops removed fingerprints; it reports
// whether anything changed.
func (t *trust) addCA(roots []*x509.Certificate, removed []string) bool {
	changed := false
	for _, fp := range removed {
		if _, ok := t.ca[fp]; ok {
			delete(t.ca, fp)
			changed = true
		}
	}
	// Newest first in the input: give earlier entries higher order.
	for i := len(roots) - 1; i >= 0; i-- {
		fp := pki.Fingerprint(roots[i])
		if _, ok := t.ca[fp]; !ok {
			t.ca[fp] = roots[i]
			t.seq++
			t.order[fp] = t.seq
			changed = true
		}
	}
	return changed
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

// prune drops expired CA roots.
func (t *trust) prune(now time.Time) {
	for fp, c := range t.ca {
		if now.After(c.NotAfter) {
			delete(t.ca, fp)
		}
	}
}

// pem returns every current root, CA roots newest first then anchors, without
// duplicates or expired certificates.
func (t *trust) pem(now time.Time) []byte {
	fps := make([]string, 0, len(t.ca))
	for fp := range t.ca {
		fps = append(fps, fp)
	}
	sort.Slice(fps, func(i, j int) bool { return t.order[fps[i]] > t.order[fps[j]] })
	seen := map[string]bool{}
	var certs []*x509.Certificate
	for _, fp := range fps {
		seen[fp] = true
		certs = append(certs, t.ca[fp])
	}
	for _, a := range t.anchors {
		if fp := pki.Fingerprint(a); !seen[fp] && !now.After(a.NotAfter) {
			seen[fp] = true
			certs = append(certs, a)
		}
	}
	return pki.EncodeCertsPEM(certs)
}

// pool returns the CA roots as a pool (to verify a gRPC CA's TLS).
func (t *trust) pool() *x509.CertPool {
	if len(t.ca) == 0 {
		return nil
	}
	p := x509.NewCertPool()
	for _, c := range t.ca {
		p.AddCert(c)
	}
	return p
}
