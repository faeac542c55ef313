package kubecsr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
)

// RA is the signer as a registration authority: it has the external signer
// certify a caller's CSR once the issuer has authenticated the caller, and
// checks the certificate against the external signer's roots.
type RA struct {
	client *Client
	roots  []*x509.Certificate
	log    hclog.Logger

	mu   sync.Mutex
	last *ca.Material // the chain above the last leaf, kept while it stays the same
}

// LoadRoots reads the external signer's roots (PEM; Istio's
// ./etc/external-ca-cert/root-cert.pem).
func LoadRoots(path string) ([]*x509.Certificate, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("external ca roots: %w", err)
	}
	roots, err := pki.ParseCertsPEM(raw)
	if err != nil {
		return nil, fmt.Errorf("external ca roots %s: %w", path, err)
	}
	for _, r := range roots {
		if !r.IsCA || r.CheckSignatureFrom(r) != nil {
			return nil, fmt.Errorf("external ca roots %s: %q is not a self-signed CA certificate", path, r.Subject)
		}
	}
	return roots, nil
}

// NewRA builds the registration authority on a client and the external signer's roots.
func NewRA(c *Client, roots []*x509.Certificate, log hclog.Logger) *RA {
	return &RA{client: c, roots: roots, log: log}
}

// Roots are the external signer's roots.
func (r *RA) Roots() []*x509.Certificate { return r.roots }

// SignerName is the external signer's name (K8S_SIGNER).
func (r *RA) SignerName() string { return r.client.cfg.SignerName }

// Sign has the external signer certify csr's key for id, for ttl. It refuses a
// CSR that names anything but id before asking (CheckCSR), and a certificate
// that is not exactly what was asked (CheckLeaf). It returns the leaf and the
// material of the chain above it.
func (r *RA) Sign(ctx context.Context, csr *x509.CertificateRequest, id *url.URL, ttl time.Duration) (*x509.Certificate, *ca.Material, error) {
	if err := CheckCSR(csr, id); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	chain, err := r.client.Sign(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr.Raw}), ttl)
	if err != nil {
		return nil, nil, err
	}
	leaf, above, err := CheckLeaf(chain, csr, id, r.roots, r.client.clk.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadCertificate, err)
	}
	m, err := r.material(above)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadCertificate, err)
	}
	return leaf, m, nil
}

// Errors of RA.Sign besides Client.Sign's.
var (
	ErrBadCSR         = errors.New("csr not sent to the external signer")
	ErrBadCertificate = errors.New("the external signer's certificate refused")
)

// material is the material of the chain above, the same as last time while the
// chain stays the same (so the NATS front end keeps its encoded reply tail).
func (r *RA) material(above []*x509.Certificate) (*ca.Material, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last != nil && slices.EqualFunc(r.last.Chain, above, func(a, b *x509.Certificate) bool { return a.Equal(b) }) {
		return r.last, nil
	}
	m, err := ca.NewExternal(above)
	if err != nil {
		return nil, err
	}
	r.last = m
	return m, nil
}
