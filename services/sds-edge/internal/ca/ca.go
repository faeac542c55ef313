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
)

// Request is one signing request. Either Token, or CertChain plus Proof (renewal
// with the still-valid current certificate), authenticates it.
type Request struct {
	CSR          []byte // PEM
	Token        string
	CertChain    []string
	Proof        string
	TTL          time.Duration
	Pod          string
	Resource     string
	KeyAlgorithm string
}

// Response is a signed chain, leaf first and root last, and the trust bundle.
type Response struct {
	Chain    []*x509.Certificate
	ChainPEM []string
	Roots    []*x509.Certificate
}

// Signer signs one CSR.
type Signer interface {
	Sign(ctx context.Context, req Request) (Response, error)
}

// ErrRejected wraps a definite refusal by the CA (bad token, bad CSR): retrying the
// same request will not help, though a fresh token may.
var ErrRejected = errors.New("rejected by ca")

// checkChain parses and checks a reply chain: at least leaf and root, each signed by
// the next.
func checkChain(pems []string) ([]*x509.Certificate, error) {
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
	return chain, nil
}
