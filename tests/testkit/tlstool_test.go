package testkit

import (
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"strings"
	"testing"
	"time"
)

// The tools tell a chain they verify from one they reject, and the difference the
// pitfall is about shows: a certificate cross-signing a root of the same name
// without an Authority Key Identifier (what Go's CreateCertificate makes when the
// template does not set one) is taken for a self-signed root by OpenSSL and
// BoringSSL, and verifies once the identifier is set.
func TestToolAcceptsTellsCrossSignedChainsApart(t *testing.T) {
	now := time.Now()
	oldRoot := NewCA(t, "mesh root", nil, now, 24*time.Hour)
	newRoot := NewCA(t, "mesh root", nil, now, 24*time.Hour)
	cross := func(aki bool) *x509.Certificate {
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(now.UnixNano()), Subject: newRoot.Cert.Subject,
			SubjectKeyId: newRoot.Cert.SubjectKeyId,
			NotBefore:    now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		if aki {
			tmpl.AuthorityKeyId = oldRoot.Cert.SubjectKeyId
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, oldRoot.Cert, newRoot.Cert.PublicKey, oldRoot.Key)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	leaf := newRoot.Issue(t, Spec{ID: "spiffe://cluster.local/ns/a/sa/b"})
	if len(oldRoot.Cert.SubjectKeyId) == 0 || len(newRoot.Cert.SubjectKeyId) == 0 {
		t.Fatal("test roots without a subject key identifier")
	}
	bare, marked := cross(false), cross(true)
	if len(bare.AuthorityKeyId) != 0 {
		t.Fatal("Go set the AKI of a same-name cross certificate: the pitfall this test shows is gone")
	}
	for _, stack := range []string{StackOpenSSL, StackBoringSSL} {
		t.Run(stack, func(t *testing.T) {
			if err := ToolAccepts(t, stack, []*x509.Certificate{leaf.Cert, marked, oldRoot.Cert}, leaf.Key, []*x509.Certificate{oldRoot.Cert}); err != nil {
				t.Errorf("cross with AKI, old root trusted: %v", err)
			}
			if err := ToolAccepts(t, stack, []*x509.Certificate{leaf.Cert, marked, newRoot.Cert}, leaf.Key, []*x509.Certificate{oldRoot.Cert}); err != nil {
				t.Errorf("cross with AKI then the new root, old root trusted: %v", err)
			}
			if err := ToolAccepts(t, stack, []*x509.Certificate{leaf.Cert, bare, oldRoot.Cert}, leaf.Key, []*x509.Certificate{oldRoot.Cert}); err == nil {
				t.Error("cross without AKI verified: the tool does not show the pitfall")
			} else {
				t.Logf("cross without AKI: %v", err)
			}
			other := NewCA(t, "mesh root", nil, now, time.Hour)
			err := ToolAccepts(t, stack, []*x509.Certificate{leaf.Cert, marked}, leaf.Key, []*x509.Certificate{other.Cert})
			if err == nil || !strings.Contains(err.Error(), "rejected") {
				t.Errorf("a chain to an untrusted root: %v", err)
			}
		})
	}
}
