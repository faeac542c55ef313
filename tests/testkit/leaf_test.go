package testkit

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net"
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
	if _, err := tls.X509KeyPair([]byte(l.PEM()), []byte(l.KeyPEM(t))); err != nil {
		t.Fatalf("KeyPEM is not the leaf's key: %v", err)
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

func TestReissuedCAKeepsItsKeyAndIssues(t *testing.T) {
	first := SelfSigned(t, Spec{IsCA: true})
	again := SelfSigned(t, Spec{Name: "root 2", IsCA: true, Key: first.Key}).CA()
	if again.Cert.Subject.CommonName != "root 2" {
		t.Fatalf("named %q", again.Cert.Subject.CommonName)
	}
	if again.Key != first.Key || again.Cert.Equal(first.Cert) || again.Cert.CheckSignatureFrom(first.Cert) != nil {
		t.Fatal("a CA re-issued for its key is not a new certificate of the same key")
	}
	srv := again.Issue(t, Spec{ID: "spiffe://td/a", URIs: []string{"spiffe://td/b"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if len(srv.Cert.URIs) != 2 || srv.Cert.URIs[1].String() != "spiffe://td/b" || srv.Cert.Subject.CommonName != "spiffe://td/a" {
		t.Fatalf("uri sans %v, cn %q", srv.Cert.URIs, srv.Cert.Subject.CommonName)
	}
	if err := srv.Cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if srv.Cert.CheckSignatureFrom(first.Cert) != nil {
		t.Fatal("a leaf of the re-issued CA does not verify under the old certificate of the same key")
	}
}
