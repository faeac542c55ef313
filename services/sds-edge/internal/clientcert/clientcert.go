// Package clientcert is the certificate sds-edge presents as a TLS client, to the
// bus (whose auth callout admits a pod without a token by it) and to the gRPC CA
// (renewal by certificate): the pod's current certificate while it is valid, else
// the provisioned one (Istio's PROV_CERT, which may be the pod's own OUTPUT_CERTS
// from before a restart), else none. It is asked at every handshake, so a
// connection made after a renewal presents the new certificate. The key never
// leaves the process.
package clientcert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/clock"
)

// Source gives the certificate to present.
type Source struct {
	prov    string // PROV_CERT directory; "": none
	current atomic.Pointer[current]
}

type current struct {
	cert func() (*tls.Certificate, error)
	clk  clock.Clock
}

// New returns a source that presents the certificate in the PROV_CERT directory
// prov ("" for none) until Use gives it the pod's own.
func New(prov string) *Source { return &Source{prov: prov} }

// Use makes s present what cert returns (the CA flow's current certificate), when
// it returns one, judging the provisioned certificate's expiry by clk.
func (s *Source) Use(cert func() (*tls.Certificate, error), clk clock.Clock) {
	s.current.Store(&current{cert: cert, clk: clk})
}

// Provisioned reports whether s has a provisioned certificate to fall back on.
func (s *Source) Provisioned() bool { return s.prov != "" }

// Get is the certificate to present now: the pod's own while it is valid, else
// the provisioned one while it is valid, else an error saying why there is none.
// Before Use, the provisioned certificate's expiry is judged by the wall clock.
func (s *Source) Get() (*tls.Certificate, error) {
	var clk clock.Clock = clock.Real{}
	var own error
	if c := s.current.Load(); c != nil {
		clk = c.clk
		cert, err := c.cert()
		if err == nil {
			return cert, nil
		}
		own = err
	}
	if s.prov == "" {
		if own == nil {
			own = errors.New("no certificate yet")
		}
		return nil, own
	}
	cert, err := Load(s.prov, clk.Now())
	if err != nil && own != nil {
		return nil, fmt.Errorf("%w; %w", own, err)
	}
	return cert, err
}

// Load reads the certificate and key in dir (certdir's files, as PROV_CERT and
// OUTPUT_CERTS hold them), refusing one that has expired at now.
func Load(dir string, now time.Time) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, certdir.ChainFile), filepath.Join(dir, certdir.KeyFile))
	if err != nil {
		return nil, fmt.Errorf("provisioned certificate: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("provisioned certificate: %w", err)
		}
	}
	if now.After(c.Leaf.NotAfter) {
		return nil, fmt.Errorf("provisioned certificate %s expired at %s", filepath.Join(dir, certdir.ChainFile), c.Leaf.NotAfter.Format(time.RFC3339))
	}
	return &c, nil
}
