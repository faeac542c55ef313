package federation

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// RootsFunc gives this trust domain's roots now and the bundle generation
// (served as the SPIFFE sequence number).
type RootsFunc func() (roots []*x509.Certificate, generation uint64)

// BundleOf builds this domain's SPIFFE bundle from its roots.
func BundleOf(td spiffeid.TrustDomain, roots []*x509.Certificate, generation uint64, refreshHint time.Duration) *spiffebundle.Bundle {
	b := spiffebundle.FromX509Authorities(td, roots)
	b.SetSequenceNumber(generation)
	if refreshHint > 0 {
		b.SetRefreshHint(refreshHint)
	}
	return b
}

// Handler is the SPIFFE bundle endpoint of trust domain td: a GET answers the
// current bundle in SPIFFE JWKS form with spiffe_refresh_hint and
// spiffe_sequence. Serve it over HTTPS with a web-PKI certificate.
func Handler(td spiffeid.TrustDomain, roots RootsFunc, refreshHint time.Duration) (http.Handler, error) {
	if td.IsZero() {
		return nil, errors.New("bundle endpoint: no trust domain")
	}
	if roots == nil {
		return nil, errors.New("bundle endpoint: no roots")
	}
	return federation.NewHandler(td, sourceFunc(func(want spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
		if want != td {
			return nil, fmt.Errorf("no bundle for %q", want)
		}
		rs, gen := roots()
		if len(rs) == 0 {
			return nil, errors.New("no roots yet")
		}
		return BundleOf(td, rs, gen, refreshHint), nil
	}))
}

type sourceFunc func(spiffeid.TrustDomain) (*spiffebundle.Bundle, error)

func (f sourceFunc) GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	return f(td)
}
