package buscallout

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/issued"
	"github.com/nats-io/jwt/v2"
)

// Reasons a connection presenting a client certificate is refused.
const (
	ReasonCertExpired       = "cert_expired"
	ReasonCertNotYetValid   = "cert_not_yet_valid"
	ReasonCertForeignRoot   = "cert_foreign_root"
	ReasonCertForeignDomain = "cert_foreign_domain"
	// ReasonBadCert: not a workload certificate of this mesh (no client-auth
	// usage, not one SPIFFE URI, unparsable).
	ReasonBadCert = "bad_cert"
	// ReasonCertNotRecorded: a valid certificate that this mesh's signers did not
	// issue to a pod (issued.Store holds no record of it): it names a service
	// account, and no pod's subjects go with that.
	ReasonCertNotRecorded = "cert_not_recorded"
	// ReasonPodMismatch: the connection claims a pod (its user name) other than the
	// one its credential proves.
	ReasonPodMismatch = "pod_mismatch"
)

// Certificates is what admitting a connection by its client certificate needs.
type Certificates struct {
	TrustDomain string
	// Roots are the mesh's current roots (the signer's trust bundle); nil while the
	// CA is not loaded.
	Roots func() []*x509.Certificate
	// Records says which pod a certificate was issued to.
	Records Records
}

// Records looks up which pod a certificate was issued to (issued.Store).
type Records interface {
	Get(ctx context.Context, serial string) (issued.Record, error)
}

var _ Records = (*issued.Store)(nil)

// recordTimeout bounds the record lookup: the server waits for the callout's answer
// only its auth timeout (seconds).
const recordTimeout = 2 * time.Second

// presented is the client's certificate chain as nats-server handed it over: the
// chain the server verified, when it did (tls verify), else what the client sent.
// Nil when the client presented none.
func presented(t *jwt.ClientTLS) ([]*x509.Certificate, error) {
	if t == nil {
		return nil, nil
	}
	pems := t.Certs
	if len(t.VerifiedChains) > 0 {
		pems = t.VerifiedChains[0]
	}
	if len(pems) == 0 {
		return nil, nil
	}
	return pki.ParseCertPEMs(pems)
}

// byCert authenticates a connection by its TLS client certificate: the chain must
// verify against the mesh's current roots now (the callout checks it itself; the
// server may have checked nothing, or against an older ca_file), with client-auth
// usage and one SPIFFE ID of this trust domain, and the certificate must be one
// this mesh's signers issued to a pod (issued.Store, matched by its SHA-256). The
// caller is that identity and pod until the certificate expires. On failure it
// returns the refusal's reason.
func (r *Responder) byCert(chain []*x509.Certificate) (authn.Caller, string, error) {
	c := r.certs
	roots := c.Roots()
	if len(roots) == 0 {
		return authn.Caller{}, ReasonNotReady, errors.New("signer has no trust bundle yet")
	}
	leaf, now := chain[0], r.now()
	if now.Before(leaf.NotBefore) {
		return authn.Caller{}, ReasonCertNotYetValid, fmt.Errorf("client certificate %s is valid only from %s", pki.SerialHex(leaf), leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(leaf.NotAfter) {
		return authn.Caller{}, ReasonCertExpired, fmt.Errorf("client certificate %s expired at %s", pki.SerialHex(leaf), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	caller, err := authn.VerifyCert(chain, roots, c.TrustDomain, x509.VerifyOptions{CurrentTime: now})
	if err != nil {
		var unknown x509.UnknownAuthorityError
		var invalid x509.CertificateInvalidError
		switch {
		case errors.As(err, &unknown):
			return authn.Caller{}, ReasonCertForeignRoot, err
		case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
			return authn.Caller{}, ReasonCertExpired, err // an intermediate's validity
		case errors.Is(err, authn.ErrForeignTrustDomain):
			return authn.Caller{}, ReasonCertForeignDomain, err
		}
		return authn.Caller{}, ReasonBadCert, err
	}
	serial := pki.SerialHex(leaf)
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	rec, err := c.Records.Get(ctx, serial)
	switch {
	case errors.Is(err, issued.ErrNoRecord):
		return authn.Caller{}, ReasonCertNotRecorded, fmt.Errorf("%s's certificate %s: %w", caller.ID, serial, err)
	case err != nil:
		return authn.Caller{}, ReasonUnavailable, err
	case rec.SHA256 != pki.Fingerprint(leaf) || rec.SPIFFEID != caller.ID.String():
		// The same serial, another certificate: not the one the signer recorded.
		return authn.Caller{}, ReasonCertNotRecorded, fmt.Errorf("certificate %s is not the one recorded under its serial", serial)
	}
	caller.Pod, caller.Expires, caller.Issued = rec.Pod, leaf.NotAfter, leaf.NotBefore
	return caller, "", nil
}
