package testkit

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"
)

// CA is a test CA: its certificate and its (P-256) key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a CA certificate named name (Organization cluster.local), signed by
// parent, or self-signed when parent is nil, valid from a minute before now for ttl.
func NewCA(t testing.TB, name string, parent *CA, now time.Time, ttl time.Duration) *CA {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("test CA key: %v", err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatalf("test CA serial: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name, Organization: []string{"cluster.local"}},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	issuer, issuerKey := tmpl, crypto.Signer(k)
	if parent != nil {
		issuer, issuerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, k.Public(), issuerKey)
	if err != nil {
		t.Fatalf("test CA %s: %v", name, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("test CA %s: %v", name, err)
	}
	return &CA{Cert: c, Key: k}
}
