package testkit

import (
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"testing"
	"time"
)

// Rotation is a root rotation to a new key as the signer makes it (services/signer,
// internal/ca phase.go): an old and a new root of one name, and the new key
// certified by the old root (the cross-signed certificate, with its key identifiers
// set). Clients' tests take every chain shape the signer returns from here.
type Rotation struct {
	Old, New *CA
	Cross    *x509.Certificate
}

// NewRotation makes the two roots and the cross certificate, valid from a minute
// before now for ttl.
func NewRotation(t testing.TB, now time.Time, ttl time.Duration) *Rotation {
	t.Helper()
	r := &Rotation{Old: NewCA(t, "meshagent root CA", nil, now, ttl), New: NewCA(t, "meshagent root CA", nil, now, ttl)}
	r.Cross = CrossSign(t, r.New.Cert, r.Old, now, ttl)
	return r
}

// CrossSign certifies root's key and name under by, with both key identifiers set
// (as the signer does: without the AKI, OpenSSL and BoringSSL take a certificate
// whose subject equals its issuer's for a self-signed root), valid from a minute
// before now for ttl.
func CrossSign(t testing.TB, root *x509.Certificate, by *CA, now time.Time, ttl time.Duration) *x509.Certificate {
	t.Helper()
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: root.Subject,
		SubjectKeyId: root.SubjectKeyId, AuthorityKeyId: by.Cert.SubjectKeyId,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: root.KeyUsage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, by.Cert, root.PublicKey, by.Key)
	if err != nil {
		t.Fatalf("cross-sign: %v", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The phases of a rotation to a new key (the signer's ca.Phase), and before it.
const (
	PhaseBefore  = 0 // old key signs; chain [old root]
	PhaseOldLast = 1 // new key signs; chain [cross, old root]
	PhaseNewLast = 2 // new key signs; chain [cross, new root]
	PhaseSettled = 3 // new key signs; chain [new root]
)

// Signer is the CA whose key signs leaves in phase.
func (r *Rotation) Signer(phase int) *CA {
	if phase == PhaseBefore {
		return r.Old
	}
	return r.New
}

// Above is what follows a leaf in a sign reply in phase, the reply's last PEM last.
func (r *Rotation) Above(phase int) []*x509.Certificate {
	switch phase {
	case PhaseBefore:
		return []*x509.Certificate{r.Old.Cert}
	case PhaseOldLast:
		return []*x509.Certificate{r.Cross, r.Old.Cert}
	case PhaseNewLast:
		return []*x509.Certificate{r.Cross, r.New.Cert}
	default:
		return []*x509.Certificate{r.New.Cert}
	}
}

// Bundle is the trust bundle in phase, newest first (the old root stays in it
// through the phases).
func (r *Rotation) Bundle(phase int) []*x509.Certificate {
	if phase == PhaseBefore {
		return []*x509.Certificate{r.Old.Cert}
	}
	return []*x509.Certificate{r.New.Cert, r.Old.Cert}
}
