package grpcapi

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
)

// ServingCerts issues the gRPC server's own certificate from the current CA material,
// on first use and again when the CA changes or half its life has passed. Its key never
// leaves the process. NewSVIDServingCerts issues an X509-SVID instead (the SPIFFE
// bundle endpoint's https_spiffe profile).
type ServingCerts struct {
	auth     *ca.Authority
	dnsNames []string
	ips      []net.IP
	id       *url.URL // an SVID's SPIFFE ID; nil: DNS names and IPs
	ttl      time.Duration
	clk      clock.Clock

	mu      sync.Mutex
	key     crypto.Signer
	cert    *tls.Certificate
	mat     *ca.Material
	renewAt time.Time
}

// NewServingCerts returns the issuer of serving certificates for these SANs.
func NewServingCerts(auth *ca.Authority, dnsNames []string, ips []net.IP, clk clock.Clock) *ServingCerts {
	return &ServingCerts{auth: auth, dnsNames: dnsNames, ips: ips, ttl: 24 * time.Hour, clk: clk}
}

// NewSVIDServingCerts returns the issuer of X509-SVIDs for id (a SPIFFE ID of this
// trust domain) to serve TLS with.
func NewSVIDServingCerts(auth *ca.Authority, id *url.URL, clk clock.Clock) *ServingCerts {
	s := NewServingCerts(auth, nil, nil, clk)
	s.id = id
	return s
}

// TLSConfig is the server's TLS configuration. Client certificates are requested, not
// required: the handler verifies them against the current roots, so root rotation
// needs no new listener.
func (s *ServingCerts) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.Get() },
	}
}

// Get returns a current serving certificate.
func (s *ServingCerts) Get() (*tls.Certificate, error) {
	mat := s.auth.Current()
	if mat == nil {
		return nil, fmt.Errorf("serving certificate: CA not loaded")
	}
	now := s.clk.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert != nil && s.mat == mat && now.Before(s.renewAt) {
		return s.cert, nil
	}
	if s.key == nil {
		k, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return nil, fmt.Errorf("serving key: %w", err)
		}
		s.key = k
	}
	var leaf *x509.Certificate
	var err error
	if s.id != nil {
		leaf, err = mat.SignLeaf(s.key.Public(), s.id, now, s.ttl)
	} else {
		leaf, err = mat.SignServing(s.key.Public(), s.dnsNames, s.ips, now, s.ttl)
	}
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	c := &tls.Certificate{PrivateKey: s.key, Leaf: leaf, Certificate: [][]byte{leaf.Raw}}
	for _, x := range mat.ServingIntermediates() { // the client has the root
		c.Certificate = append(c.Certificate, x.Raw)
	}
	s.cert, s.mat = c, mat
	s.renewAt = leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	return c, nil
}
