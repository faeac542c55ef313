package testkit

import (
	"crypto/x509"
	"testing"
	"time"
)

func TestNewCAChainsToItsParent(t *testing.T) {
	now := time.Now()
	root := NewCA(t, "root", nil, now, time.Hour)
	inter := NewCA(t, "inter", root, now, 30*time.Minute)
	if !root.Cert.IsCA || !inter.Cert.IsCA {
		t.Fatal("not CA certificates")
	}
	if inter.Cert.Subject.CommonName != "inter" || !inter.Cert.NotAfter.Equal(now.Add(30*time.Minute).Truncate(time.Second)) {
		t.Fatalf("inter: %s until %s", inter.Cert.Subject, inter.Cert.NotAfter)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	if _, err := inter.Cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now}); err != nil {
		t.Fatalf("inter does not chain to root: %v", err)
	}
	if _, err := root.Cert.Verify(x509.VerifyOptions{Roots: x509.NewCertPool(), CurrentTime: now}); err == nil {
		t.Fatal("root verifies without being trusted")
	}
}
