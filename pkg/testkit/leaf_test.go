package testkit

import (
	"crypto/x509"
	"math/big"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
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
	if certs, err := pki.ParseCertsPEM([]byte(l.PEM() + root.PEM())); err != nil || !certs[0].Equal(l.Cert) || !certs[1].Equal(root.Cert) {
		t.Fatalf("PEM does not round-trip: %v", err)
	}
	if s := SelfSigned(t, Spec{IsCA: true}); s.Cert.CheckSignatureFrom(s.Cert) != nil || !s.Cert.IsCA {
		t.Fatal("self-signed CA does not sign itself")
	}
}

func TestEndorsementsVerifyUnderTheEndorsingCAs(t *testing.T) {
	a, b := NewCA(t, "a", nil, time.Now(), time.Hour), NewCA(t, "b", nil, time.Now(), time.Hour)
	roots := []string{a.PEM(), b.PEM()}
	ends := Endorse(t, "td", 3, roots, a.Key, b.Key)
	msg, err := events.EndorsedBytes("td", 3, roots)
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != 2 {
		t.Fatalf("%d endorsements, want 2", len(ends))
	}
	for i, ca := range []*CA{a, b} {
		if err := pki.VerifyEndorsement([]*x509.Certificate{ca.Cert}, msg, ends[i].KeyID, ends[i].Signature, nil); err != nil {
			t.Fatalf("endorsement %d: %v", i, err)
		}
	}
	if pki.VerifyEndorsement([]*x509.Certificate{a.Cert}, msg, ends[1].KeyID, ends[1].Signature, nil) == nil {
		t.Fatal("b's endorsement verifies under a")
	}
}
