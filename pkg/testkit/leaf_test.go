package testkit

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

func TestIssuedLeafVerifiesUnderItsCAOnly(t *testing.T) {
	now := time.Now()
	root, other := NewCA(t, "root", nil, now.Add(-30*24*time.Hour), 60*24*time.Hour), NewCA(t, "other", nil, now, time.Hour)
	nb := now.Add(-10 * 24 * time.Hour)
	l := root.Issue(t, Spec{ID: "spiffe://td/ns/a/sa/b", DNS: []string{"x.test"}, Serial: big.NewInt(0x2a), NotBefore: nb, Life: time.Hour})
	if l.Cert.SerialNumber.Int64() != 0x2a || !l.Cert.NotBefore.Equal(nb.Truncate(time.Second)) || l.Cert.NotAfter.Sub(l.Cert.NotBefore) != time.Hour {
		t.Fatalf("serial %v, valid %v to %v", l.Cert.SerialNumber, l.Cert.NotBefore, l.Cert.NotAfter)
	}
	if len(l.Cert.URIs) != 1 || l.Cert.URIs[0].String() != "spiffe://td/ns/a/sa/b" || l.Cert.DNSNames[0] != "x.test" || l.Cert.IsCA {
		t.Fatalf("leaf %v %v ca=%v", l.Cert.URIs, l.Cert.DNSNames, l.Cert.IsCA)
	}
	verify := func(ca *CA) error {
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		_, err := l.Cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: nb.Add(time.Minute), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
	if err := verify(root); err != nil {
		t.Fatalf("leaf does not verify under its CA: %v", err)
	}
	if verify(other) == nil {
		t.Fatal("leaf verifies under another CA")
	}
	if tc := l.TLS(); tc.Leaf != l.Cert || tc.PrivateKey != l.Key {
		t.Fatal("TLS certificate is not the leaf")
	}
	for _, c := range []struct {
		pem  string
		cert *x509.Certificate
	}{{l.PEM(), l.Cert}, {root.PEM(), root.Cert}} {
		if b, _ := pem.Decode([]byte(c.pem)); b == nil || b.Type != "CERTIFICATE" || !bytes.Equal(b.Bytes, c.cert.Raw) {
			t.Fatalf("PEM is not the certificate: %q", c.pem)
		}
	}
	if s := SelfSigned(t, Spec{IsCA: true}); s.Cert.CheckSignatureFrom(s.Cert) != nil || !s.Cert.IsCA {
		t.Fatal("self-signed CA does not sign itself")
	}
}
