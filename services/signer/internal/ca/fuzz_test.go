package ca

import (
	"crypto"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// fuzzCANow is the fixed time of every fuzz iteration, so that a saved crasher replays.
var fuzzCANow = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

// fuzzCert makes a certificate for key signed by parent (self-signed when nil).
func fuzzCert(f *testing.F, name string, key crypto.Signer, parent *x509.Certificate, parentKey crypto.Signer, isCA bool, from, to time.Time) *x509.Certificate {
	f.Helper()
	s := testkit.Spec{Name: name, Key: key, IsCA: isCA, NotBefore: from, Life: to.Sub(from)}
	if parent == nil {
		return testkit.SelfSigned(f, s).Cert
	}
	return (&testkit.CA{Cert: parent, Key: parentKey}).Issue(f, s).Cert
}

// FuzzLoadDir writes fuzzed contents as an Istio cacerts directory (ca-cert.pem,
// ca-key.pem, cert-chain.pem, root-cert.pem; an empty cert-chain.pem counts as
// absent) and loads it. Seeds: root-only and intermediate layouts with EC and RSA
// keys in SEC 1, PKCS#1 and PKCS#8, a bundle of two roots, and broken variants
// (mismatched key, non-CA, expired, chain to another root, garbage).
//
// Properties: no panic; a load either fails with ErrInvalidMaterial or yields
// material whose signing certificate is the first of ca-cert.pem and a CA, whose
// key matches it (and signs a leaf that verifies), and whose chain runs from it,
// each link signed by the next, to one of the roots of root-cert.pem.
func FuzzLoadDir(f *testing.F) {
	from, to := fuzzCANow.Add(-time.Minute), fuzzCANow.Add(10*365*24*time.Hour)
	key := func(alg pki.KeyAlg) crypto.Signer {
		k, err := pki.GenerateKey(alg)
		if err != nil {
			f.Fatal(err)
		}
		return k
	}
	keyPEM := func(k crypto.Signer, pkcs8 bool) []byte {
		b, err := pki.EncodeKeyPEM(k, pkcs8)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	pems := pki.EncodeCertsPEM
	type certs = []*x509.Certificate
	rootKey, interKey, rsaKey, otherKey := key(pki.ECP256), key(pki.ECP384), key(pki.RSA2048), key(pki.ECP256)
	root := fuzzCert(f, "root", rootKey, nil, nil, true, from, to)
	inter := fuzzCert(f, "inter", interKey, root, rootKey, true, from, to)
	rsaInter := fuzzCert(f, "rsa inter", rsaKey, root, rootKey, true, from, to)
	other := fuzzCert(f, "other root", otherKey, nil, nil, true, from, to)
	leaf := fuzzCert(f, "not a ca", otherKey, root, rootKey, false, from, to)
	expired := fuzzCert(f, "expired", interKey, root, rootKey, true, from.Add(-48*time.Hour), from.Add(-24*time.Hour))
	seeds := []struct{ caCert, caKey, chain, roots []byte }{
		{pems(certs{root}), keyPEM(rootKey, false), pems(certs{root}), pems(certs{root})},
		{pems(certs{root}), keyPEM(rootKey, true), nil, pems(certs{root})},
		{pems(certs{inter}), keyPEM(interKey, false), pems(certs{inter, root}), pems(certs{root})},
		{pems(certs{inter}), keyPEM(interKey, true), nil, pems(certs{other, root})},
		{pems(certs{inter, root}), keyPEM(interKey, false), nil, pems(certs{root})},
		{pems(certs{rsaInter}), keyPEM(rsaKey, false), pems(certs{rsaInter, root}), pems(certs{root})},
		{pems(certs{rsaInter}), keyPEM(rsaKey, true), pems(certs{root}), pems(certs{root})},
		{pems(certs{inter}), append(pems(certs{inter}), keyPEM(interKey, false)...), nil, pems(certs{root})},
		{pems(certs{inter}), keyPEM(rootKey, false), nil, pems(certs{root})},
		{pems(certs{inter}), keyPEM(interKey, false), nil, pems(certs{other})},
		{pems(certs{leaf}), keyPEM(otherKey, false), nil, pems(certs{root})},
		{pems(certs{expired}), keyPEM(interKey, false), nil, pems(certs{root})},
		{pems(certs{inter}), keyPEM(interKey, false), []byte("garbage"), pems(certs{root})},
		{append(pems(certs{inter}), "trailing text"...), keyPEM(interKey, false), nil, pems(certs{root})},
		{nil, nil, nil, nil},
	}
	for _, s := range seeds {
		f.Add(s.caCert, s.caKey, s.chain, s.roots)
	}

	dir := f.TempDir()
	write := func(t testing.TB, name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/fuzz/sa/leaf")
	leafKey := key(pki.ECP256)
	load := func(t testing.TB, caCert, caKey, chain, roots []byte) (*Material, error) {
		write(t, CACertFile, caCert)
		write(t, CAKeyFile, caKey)
		write(t, CertChainFile, chain)
		write(t, RootCertFile, roots)
		return LoadDir(dir, fuzzCANow)
	}
	// The good layouts must load, or the properties below check nothing.
	for _, i := range []int{0, 2, 5} {
		if _, err := load(f, seeds[i].caCert, seeds[i].caKey, seeds[i].chain, seeds[i].roots); err != nil {
			f.Fatalf("seed %d does not load: %v", i, err)
		}
	}
	f.Fuzz(func(t *testing.T, caCert, caKey, chain, roots []byte) {
		m, err := load(t, caCert, caKey, chain, roots)
		if err != nil {
			if !errors.Is(err, ErrInvalidMaterial) {
				t.Fatalf("error %v does not wrap ErrInvalidMaterial", err)
			}
			if m != nil {
				t.Fatal("material returned with an error")
			}
			return
		}

		// Loaded: check it from the files, not from what LoadDir says.
		fileCerts, err := pki.ParseCertsPEM(caCert)
		if err != nil || !fileCerts[0].Equal(m.Cert) {
			t.Fatalf("signing certificate is not the first of %s (%v)", CACertFile, err)
		}
		fileRoots, err := pki.ParseCertsPEM(roots)
		if err != nil {
			t.Fatalf("loaded although %s does not parse: %v", RootCertFile, err)
		}
		if !m.Cert.IsCA || !m.Cert.BasicConstraintsValid {
			t.Fatal("signing certificate is not a CA")
		}
		type equaler interface{ Equal(crypto.PublicKey) bool }
		if pub, ok := m.Key.Public().(equaler); !ok || !pub.Equal(m.Cert.PublicKey) {
			t.Fatal("key does not match the signing certificate")
		} // and the leaf signed below proves that the private key is the certificate's
		if len(m.Chain) == 0 || !m.Chain[0].Equal(m.Cert) {
			t.Fatal("chain does not start at the signing certificate")
		}
		for i := 0; i+1 < len(m.Chain); i++ {
			if err := m.Chain[i].CheckSignatureFrom(m.Chain[i+1]); err != nil {
				t.Fatalf("chain link %d (%s) is not signed by %s: %v", i, m.Chain[i].Subject, m.Chain[i+1].Subject, err)
			}
		}
		top := m.Chain[len(m.Chain)-1]
		if !fuzzContains(fileRoots, top) {
			t.Fatalf("chain ends at %s, which is not in %s", top.Subject, RootCertFile)
		}
		rootPool, interPool := x509.NewCertPool(), x509.NewCertPool()
		for _, r := range fileRoots {
			rootPool.AddCert(r)
		}
		for _, c := range m.Chain[1:] {
			interPool.AddCert(c)
		}
		opts := x509.VerifyOptions{Roots: rootPool, Intermediates: interPool, CurrentTime: fuzzCANow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
		if _, err := m.Cert.Verify(opts); err != nil {
			t.Fatalf("signing certificate does not verify to %s: %v", RootCertFile, err)
		}
		issued, err := m.SignLeaf(leafKey.Public(), id, fuzzCANow, time.Hour)
		if errors.Is(err, ErrCAExpired) && !m.NotAfter().After(fuzzCANow) {
			return
		}
		if err != nil {
			t.Fatalf("loaded material cannot sign: %v", err)
		}
		interPool.AddCert(m.Cert)
		if _, err := issued.Verify(opts); err != nil {
			t.Fatalf("a leaf signed with the loaded material does not verify to %s: %v", RootCertFile, err)
		}
	})
}

func fuzzContains(cs []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range cs {
		if x.Equal(c) {
			return true
		}
	}
	return false
}
