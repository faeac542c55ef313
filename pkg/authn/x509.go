package authn

import (
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/meshagent/meshagent/pkg/pki"
)

// ErrForeignTrustDomain is a client certificate that chains to the mesh's roots but
// names another trust domain.
var ErrForeignTrustDomain = errors.New("foreign trust domain")

// VerifyCert authenticates a caller by a still-valid certificate (chain[0], with any
// intermediates after it) that chains to one of roots at now with client-auth usage.
// Possession of its key is proven by the caller: by the TLS handshake over gRPC, by
// a proof over the CSR over NATS. The identity is the certificate's one SPIFFE URI
// SAN, which must be a workload ID in trustDomain.
func VerifyCert(chain, roots []*x509.Certificate, trustDomain string, opts x509.VerifyOptions) (Caller, error) {
	if len(chain) == 0 {
		return Caller{}, fail("no client certificate")
	}
	opts.Roots = x509.NewCertPool()
	for _, r := range roots {
		opts.Roots.AddCert(r)
	}
	opts.Intermediates = x509.NewCertPool()
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, err := chain[0].Verify(opts); err != nil {
		// Wrapped, so that a caller can tell an unknown authority from an expiry.
		return Caller{}, fmt.Errorf("%w: client certificate: %w", ErrUnauthenticated, err)
	}
	if len(chain[0].URIs) != 1 {
		return Caller{}, fail("client certificate has %d URI SANs, want 1", len(chain[0].URIs))
	}
	id := chain[0].URIs[0]
	td, _, _, err := pki.ParseWorkloadID(id.String())
	if err != nil {
		return Caller{}, fail("client certificate: %v", err)
	}
	if td != trustDomain {
		return Caller{}, fmt.Errorf("%w: %w: client certificate is for trust domain %q, not %q", ErrUnauthenticated, ErrForeignTrustDomain, td, trustDomain)
	}
	return Caller{ID: id, Source: SourceX509}, nil
}
