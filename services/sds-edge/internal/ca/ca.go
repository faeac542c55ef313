// Package ca asks a certificate authority to sign sds-edge's CSRs: the signer over
// NATS request-reply, or an Istio-compatible CA over gRPC (CA_ADDR). Both implement
// one small interface.
package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
)

// Request is one signing request. Either Token, or CertChain plus Proof (renewal
// with the still-valid current certificate), authenticates it.
type Request struct {
	CSR          []byte // PEM
	SPIFFEID     string // the identity the leaf must carry, exactly, as its only URI SAN
	Token        string
	CertChain    []string
	Proof        string
	TTL          time.Duration
	Pod          string
	Resource     string
	KeyAlgorithm string
}

// Response is a signed chain, leaf first and root last, and the trust bundle that
// came with it. Neither is trusted yet: the caller checks Bundle's endorsements and
// that Chain verifies to a root it trusts.
type Response struct {
	Chain    []*x509.Certificate
	ChainPEM []string
	// Bundle is the reply's trust bundle. Endorsed is false when the CA sends none
	// (Istio's CreateCertificate): Bundle then holds only the chain's last
	// certificate, which vouches for nothing.
	Bundle   trustbundle.Bundle
	Endorsed bool
}

// Signer signs one CSR.
type Signer interface {
	Sign(ctx context.Context, req Request) (Response, error)
}

// ErrRejected wraps a definite refusal by the CA (bad token, bad CSR): retrying the
// same request will not help, though a fresh token may.
var ErrRejected = errors.New("rejected by ca")

// checkChain parses and checks a reply chain: at least leaf and root, each signed by
// the next, and a leaf for exactly id (so that no responder can hand the pod
// another identity). Whether the root is one the pod trusts is the caller's check.
func checkChain(pems []string, id string) ([]*x509.Certificate, error) {
	if len(pems) < 2 {
		return nil, fmt.Errorf("chain has %d certificate(s): want leaf and root at least", len(pems))
	}
	chain, err := pki.ParseCertPEMs(pems)
	if err != nil {
		return nil, fmt.Errorf("parse chain: %w", err)
	}
	for i := 0; i+1 < len(chain); i++ {
		if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
			return nil, fmt.Errorf("chain[%d] not signed by chain[%d]: %w", i, i+1, err)
		}
	}
	if err := checkLeafID(chain[0], id); err != nil {
		return nil, err
	}
	return chain, nil
}

// checkLeafID checks that leaf's one URI SAN is exactly id.
func checkLeafID(leaf *x509.Certificate, id string) error {
	if id == "" {
		return errors.New("no spiffe id to check the signed certificate against")
	}
	uris := make([]string, len(leaf.URIs))
	for i, u := range leaf.URIs {
		uris[i] = u.String()
	}
	if len(uris) != 1 || uris[0] != id {
		return fmt.Errorf("signed certificate is for %v, not %s", uris, id)
	}
	return nil
}
