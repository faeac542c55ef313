package testkit

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"testing"
	"time"
)

// Leaf is a certificate a test CA issued (or a self-signed one) and its P-256 key.
type Leaf struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Spec says what a leaf certifies; zero fields take the defaults.
type Spec struct {
	ID        string        // SPIFFE ID, the one URI SAN; "": none
	DNS       []string      // DNS SANs
	Serial    *big.Int      // nil: random
	NotBefore time.Time     // zero: an hour ago
	Life      time.Duration // zero: two hours (so an hour left)
	IsCA      bool          // a CA certificate instead of a TLS client and server one
}

// Issue makes a fresh key and a certificate for it as s says, signed by c.
func (c *CA) Issue(t testing.TB, s Spec) *Leaf {
	t.Helper()
	return issue(t, s, c)
}

// SelfSigned makes a certificate as s says that signs itself.
func SelfSigned(t testing.TB, s Spec) *Leaf {
	t.Helper()
	return issue(t, s, nil)
}

// PEM is the CA certificate in PEM.
func (c *CA) PEM() string { return certPEM(c.Cert) }

// PEM is the leaf certificate in PEM.
func (l *Leaf) PEM() string { return certPEM(l.Cert) }

// TLS is the leaf as a TLS certificate (the leaf alone, no chain).
func (l *Leaf) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{l.Cert.Raw}, PrivateKey: l.Key, Leaf: l.Cert}
}

// issue makes the certificate s describes, signed by parent (nil: by itself).
func issue(t testing.TB, s Spec, parent *CA) *Leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("test leaf key: %v", err)
	}
	nb, life, serial := s.NotBefore, s.Life, s.Serial
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour)
	}
	if life == 0 {
		life = 2 * time.Hour
	}
	if serial == nil {
		if serial, err = rand.Int(rand.Reader, big.NewInt(1<<62)); err != nil {
			t.Fatalf("test leaf serial: %v", err)
		}
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: s.ID}, DNSNames: s.DNS,
		NotBefore: nb, NotAfter: nb.Add(life), BasicConstraintsValid: true, IsCA: s.IsCA,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if s.IsCA {
		tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature, nil
	}
	if s.ID == "" && len(s.DNS) > 0 {
		tmpl.Subject.CommonName = s.DNS[0]
	}
	if s.ID != "" {
		u, err := url.Parse(s.ID)
		if err != nil {
			t.Fatalf("spiffe id %q: %v", s.ID, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	signer, signerKey := tmpl, crypto.Signer(key)
	if parent != nil {
		signer, signerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, key.Public(), signerKey)
	if err != nil {
		t.Fatalf("test leaf %s: %v", tmpl.Subject.CommonName, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("test leaf %s: %v", tmpl.Subject.CommonName, err)
	}
	return &Leaf{Cert: c, Key: key}
}

func certPEM(c *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}
