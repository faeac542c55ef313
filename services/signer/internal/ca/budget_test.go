package ca

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// paddedRoot is a self-signed root padded with an extension of pad bytes.
func paddedRoot(t *testing.T, pad int) (*x509.Certificate, *Material) {
	t.Helper()
	k := mustKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(int64(pad) + 1), Subject: pkix.Name{CommonName: "padded"},
		NotBefore: t0.Add(-time.Minute), NotAfter: t0.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage:        x509.KeyUsageCertSign,
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Value: make([]byte, pad)}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, &Material{Key: k, Cert: c}
}

// The largest bundle and chain NewMaterial accepts still fit every reply and event
// that carries them, with a full set of endorsements; one byte more is refused.
func TestMaterialBudgetKeepsEventsUnderTheLimit(t *testing.T) {
	// Ten PEMs count against the budget: the chain (the root) twice and eight roots.
	const pemsCounted = 2 + MaxRoots
	perPEM := MaxMaterialBytes / pemsCounted
	var roots []*x509.Certificate
	root, _ := paddedRoot(t, 0)
	base := len(pki.EncodeCertPEM(root))
	var signer *Material
	pad := (perPEM - base) * 3 / 4 // PEM is base64 (4/3) of the DER
	for {
		root, signer = paddedRoot(t, pad)
		if len(pki.EncodeCertPEM(root)) <= perPEM {
			break
		}
		pad -= 16
	}
	roots = append(roots, root)
	for len(roots) < MaxRoots {
		r, _ := paddedRoot(t, pad)
		roots = append(roots, r)
	}
	m, err := NewMaterial(signer.Key, root, nil, roots, 7, t0)
	if err != nil {
		t.Fatalf("material at the budget refused: %v", err)
	}
	if n := 2*pemBytes(m.ChainPEMs()) + pemBytes(m.RootPEMs()); n < MaxMaterialBytes*95/100 {
		t.Fatalf("test material of %d bytes is not near the budget %d", n, MaxMaterialBytes)
	}
	// Endorsements as large as RSA-4096 makes them, one per root key.
	sig := strings.Repeat("A", 684)
	for range MaxRoots {
		m.endorsements = append(m.endorsements, events.Endorsement{KeyID: strings.Repeat("f", 64), Signature: sig, Chain: m.IntermediatePEMs()})
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/a/sa/b")
	leaf, err := m.SignLeaf(mustKey(t).Public(), id, t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	chain := append([]string{string(pki.EncodeCertPEM(leaf))}, m.ChainPEMs()...)
	fps := m.RootFingerprints()
	for name, p := range map[string]events.Payload{
		"sign reply":    events.SignReply{CertChain: chain, Roots: m.RootPEMs(), TrustDomain: "cluster.local", Generation: 7, Endorsements: m.Endorsements()},
		"bundle reply":  events.BundleReply{TrustDomain: "cluster.local", Roots: m.RootPEMs(), Generation: 7, Endorsements: m.Endorsements()},
		"trust.changed": events.TrustChanged{TrustDomain: "cluster.local", Roots: m.RootPEMs(), Added: fps, Removed: fps, Reason: events.TrustReasonRotation, Generation: 7, Endorsements: m.Endorsements()},
		"rotate reply":  events.RotateReply{Fingerprint: m.RootFingerprint(), Roots: m.RootPEMs()},
		"cert.issued": events.CertIssued{Serial: "1", SPIFFEID: id.String(), NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, KeyAlgorithm: "EC-P256",
			AuthSource: "jwt", Signer: "s", RootFingerprint: m.RootFingerprint(), CertChain: chain[:len(chain)-1]},
	} {
		if _, err := events.NewMsg("x", "meshagent/signer/s", p); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Over the budget: the signing root larger by a tenth of the budget.
	big, bigSigner := paddedRoot(t, pad+MaxMaterialBytes/pemsCounted)
	if _, err := NewMaterial(bigSigner.Key, big, nil, append([]*x509.Certificate{big}, roots[1:]...), 7, t0); !errors.Is(err, ErrInvalidMaterial) || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("material over the budget: %v", err)
	}
	// More roots than MaxRoots.
	if _, err := NewMaterial(signer.Key, root, nil, append(roots, roots[1]), 7, t0); !errors.Is(err, ErrInvalidMaterial) || !strings.Contains(err.Error(), "at most 8") {
		t.Fatalf("material with %d roots: %v", MaxRoots+1, err)
	}
}
