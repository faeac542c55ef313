// Package testca makes certificates for tests: self-signed roots with their keys,
// the leaves they issue (a SPIFFE ID, DNS names, a chosen serial and validity),
// and endorsements of a trust bundle as the signer makes them. Imported by tests
// only; every key is P-256.
package testca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Leaf is a certificate a CA issued (or a self-signed one) and its key.
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
	IsCA      bool          // a CA certificate (no key usage for TLS)
}

// New makes a self-signed root named name, valid from 30 days ago for a year
// (long enough for any leaf a test backdates or a fake clock moves to).
func New(t testing.TB, name string) *CA {
	t.Helper()
	key := Key(t)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-30 * 24 * time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	return &CA{Cert: create(t, tmpl, tmpl, key, key), Key: key}
}

// PEM is the CA certificate in PEM.
func (c *CA) PEM() string { return string(pki.EncodeCertPEM(c.Cert)) }

// Issue makes a fresh key and a certificate for it as s says, signed by c.
func (c *CA) Issue(t testing.TB, s Spec) *Leaf {
	t.Helper()
	key := Key(t)
	return &Leaf{Cert: create(t, template(t, s), c.Cert, key, c.Key), Key: key}
}

// SelfSigned makes a certificate as s says that signs itself.
func SelfSigned(t testing.TB, s Spec) *Leaf {
	t.Helper()
	key := Key(t)
	tmpl := template(t, s)
	return &Leaf{Cert: create(t, tmpl, tmpl, key, key), Key: key}
}

// PEM is the leaf certificate in PEM.
func (l *Leaf) PEM() string { return string(pki.EncodeCertPEM(l.Cert)) }

// TLS is the leaf as a TLS certificate (the leaf alone, no chain).
func (l *Leaf) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{l.Cert.Raw}, PrivateKey: l.Key, Leaf: l.Cert}
}

// Endorse signs the bundle (trustDomain, gen, roots) with each key, as the signer
// vouches for a bundle in trust.changed and bundle replies (events.EndorsedBytes).
func Endorse(t testing.TB, trustDomain string, gen uint64, roots []string, keys ...crypto.Signer) []events.Endorsement {
	t.Helper()
	msg, err := events.EndorsedBytes(trustDomain, gen, roots)
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Endorsement
	for _, k := range keys {
		id, sig, err := pki.Endorse(k, msg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, events.Endorsement{KeyID: id, Signature: sig})
	}
	return out
}

// Key makes a P-256 key.
func Key(t testing.TB) crypto.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func template(t testing.TB, s Spec) *x509.Certificate {
	t.Helper()
	nb, life, sn := s.NotBefore, s.Life, s.Serial
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour)
	}
	if life == 0 {
		life = 2 * time.Hour
	}
	if sn == nil {
		sn = serial(t)
	}
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: s.ID}, DNSNames: s.DNS,
		NotBefore: nb, NotAfter: nb.Add(life), BasicConstraintsValid: true, IsCA: s.IsCA}
	if len(s.DNS) > 0 && s.ID == "" {
		tmpl.Subject.CommonName = s.DNS[0]
	}
	if s.IsCA {
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	if s.ID != "" {
		u, err := url.Parse(s.ID)
		if err != nil {
			t.Fatalf("spiffe id %q: %v", s.ID, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	return tmpl
}

func create(t testing.TB, tmpl, parent *x509.Certificate, key, parentKey crypto.Signer) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n.Add(n, big.NewInt(1)) // never zero
}
