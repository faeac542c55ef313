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
	"net"
	"net/url"
	"testing"
	"time"
)

// Leaf is a certificate a test CA issued (or a self-signed one) and its key.
type Leaf struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Spec says what a leaf certifies; zero fields take the defaults.
type Spec struct {
	Name      string        // subject CN; "": the ID, or else the first DNS name
	ID        string        // SPIFFE ID, the first URI SAN; "": none
	URIs      []string      // more URI SANs after ID (a certificate claiming several identities)
	DNS       []string      // DNS SANs
	IPs       []net.IP      // IP SANs (a TLS server on loopback)
	Key       crypto.Signer // the key certified; nil: a fresh P-256 key (a new certificate for an old key: a CA re-issued)
	Serial    *big.Int      // nil: random
	NotBefore time.Time     // zero: an hour ago
	Life      time.Duration // zero: two hours (so an hour left)
	IsCA      bool          // a CA certificate instead of a TLS client and server one
}

// Issue makes a certificate as s says (for a fresh key unless s.Key), signed by c.
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

// KeyPEM is the leaf's private key in PKCS#8 PEM ("PRIVATE KEY"), as a key file holds it.
func (l *Leaf) KeyPEM(t testing.TB) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(l.Key)
	if err != nil {
		t.Fatalf("test leaf key: %v", err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// CA is a leaf made with IsCA as a CA that can issue.
func (l *Leaf) CA() *CA { return &CA{Cert: l.Cert, Key: l.Key} }

// TLS is the leaf as a TLS certificate (the leaf alone, no chain).
func (l *Leaf) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{l.Cert.Raw}, PrivateKey: l.Key, Leaf: l.Cert}
}

// issue makes the certificate s describes, signed by parent (nil: by itself).
func issue(t testing.TB, s Spec, parent *CA) *Leaf {
	t.Helper()
	key := s.Key
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatalf("test leaf key: %v", err)
		}
		key = k
	}
	var err error
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
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: s.ID}, DNSNames: s.DNS, IPAddresses: s.IPs,
		NotBefore: nb, NotAfter: nb.Add(life), BasicConstraintsValid: true, IsCA: s.IsCA,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if s.IsCA {
		tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature, nil
	}
	switch {
	case s.Name != "":
		tmpl.Subject.CommonName = s.Name
	case s.ID == "" && len(s.DNS) > 0:
		tmpl.Subject.CommonName = s.DNS[0]
	}
	for _, id := range append([]string{s.ID}, s.URIs...) {
		if id == "" {
			continue
		}
		u, err := url.Parse(id)
		if err != nil {
			t.Fatalf("uri san %q: %v", id, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	signer, signerKey := tmpl, key
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
