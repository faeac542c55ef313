// Package signertest builds the fixtures only the signer's tests need: CSRs, Istio cacerts
// directories, a CA key-encryption key file and a check of trust-bundle
// endorsements. What every module's tests share (polling, test CAs, the fake
// clock) is in tests/testkit and pkg/clock.
package signertest

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// CSR makes a key of alg and a CSR asking for id.
func CSR(t testing.TB, alg pki.KeyAlg, id string) (crypto.Signer, []byte) {
	t.Helper()
	k, err := pki.GenerateKey(alg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pki.NewCSR(k, id)
	if err != nil {
		t.Fatal(err)
	}
	return k, p
}

// WriteCACerts writes an Istio cacerts directory: ca-cert.pem and ca-key.pem from
// signing, cert-chain.pem = signing + chain..., root-cert.pem = roots.
func WriteCACerts(t testing.TB, dir string, signing *testkit.CA, chain []*x509.Certificate, roots ...*x509.Certificate) {
	t.Helper()
	key, err := pki.EncodeKeyPEM(signing.Key, false)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"ca-cert.pem":    pki.EncodeCertPEM(signing.Cert),
		"ca-key.pem":     key,
		"cert-chain.pem": pki.EncodeCertsPEM(append([]*x509.Certificate{signing.Cert}, chain...)),
		"root-cert.pem":  pki.EncodeCertsPEM(roots),
	}
	for name, b := range files {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// KEKFile writes 32 random bytes, mode 0600, to a file in a fresh t.TempDir() and
// returns its path: the signer's -ca-kek-file.
func KEKFile(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca-kek")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// VerifyEndorsed checks, as a pod does, that one of ends vouches for the bundle
// (trustDomain, gen, roots) under a key of trusted; pki.ErrNotEndorsed otherwise.
func VerifyEndorsed(trusted []*x509.Certificate, trustDomain string, gen uint64, roots []string, ends []events.Endorsement) error {
	msg, err := events.EndorsedBytes(trustDomain, gen, roots)
	if err != nil {
		return err
	}
	errs := []error{pki.ErrNotEndorsed}
	for _, e := range ends {
		chain, err := pki.ParseCertPEMs(e.Chain)
		if err != nil {
			return err
		}
		if err := pki.VerifyEndorsement(trusted, msg, e.KeyID, e.Signature, chain); err != nil {
			errs = append(errs, err)
			continue
		}
		return nil
	}
	return errors.Join(errs...)
}
