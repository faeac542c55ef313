// Package signertest builds the fixtures only the signer's tests need: a dev token
// issuer with its JWKS file (the shape `meshctl token` mints), CSRs, Istio cacerts
// directories, a CA key-encryption key file and a check of trust-bundle
// endorsements. What every module's tests share (polling, test CAs, the fake
// clock) is in tests/testkit and pkg/clock.
package signertest

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// Issuer mints ES256 tokens as meshctl token does (pkg/devtoken): kid is the
// key's JWK thumbprint.
type Issuer struct {
	Key crypto.Signer
	KID string
	Iss string
}

// NewIssuer makes an issuer named iss with a fresh P-256 key.
func NewIssuer(t testing.TB, iss string) *Issuer {
	t.Helper()
	d, err := devtoken.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return &Issuer{Key: d.Key(), KID: d.KID(), Iss: iss}
}

// JWKS is the issuer's public key set.
func (i *Issuer) JWKS() jose.JSONWebKeySet {
	return jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: i.Key.Public(), KeyID: i.KID, Algorithm: string(jose.ES256), Use: "sig"}}}
}

// WriteJWKS writes the key set to dir/jwks.json and returns the path.
func (i *Issuer) WriteJWKS(t testing.TB, dir string) string {
	t.Helper()
	b, err := json.Marshal(i.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Claims are a token's claims; zero fields are left out (devtoken.Token).
type Claims = devtoken.Token

// ServiceAccount returns the claims meshctl token mints for ns/sa, valid for ttl from now.
func (i *Issuer) ServiceAccount(ns, sa string, now time.Time, ttl time.Duration) Claims {
	return devtoken.ServiceAccount(i.Iss, devtoken.DefaultAudience, ns, sa, now, ttl)
}

// Mint signs c with the issuer's key and kid.
func (i *Issuer) Mint(t testing.TB, c Claims) string {
	t.Helper()
	return MintWith(t, i.Key, i.KID, c)
}

// MintWith signs c with key under kid.
func MintWith(t testing.TB, key crypto.Signer, kid string, c Claims) string {
	t.Helper()
	tok, err := devtoken.Sign(key, kid, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

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
