// Package testkit builds what the signer's tests need: a dev token issuer with its
// JWKS (the shape `meshctl token` mints), CSRs, Istio cacerts directories, a CA
// key-encryption key file and a settable clock.
package testkit

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/testkit"
)

// Clock is the shared fake clock (pkg/clock): Now, Add, Set, and timers that fire
// when it moves.
type Clock = clock.Fake

// NewClock starts a fake clock at t.
func NewClock(t time.Time) *Clock { return clock.NewFake(t) }

// Issuer mints ES256 tokens the way meshctl token does: kid is the key's JWK thumbprint.
type Issuer struct {
	Key crypto.Signer
	KID string
	Iss string
}

// NewIssuer makes an issuer with a fresh P-256 key.
func NewIssuer(t testing.TB, iss string) *Issuer {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	jwk := jose.JSONWebKey{Key: k.Public(), Algorithm: string(jose.ES256), Use: "sig"}
	tp, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return &Issuer{Key: k, KID: base64.RawURLEncoding.EncodeToString(tp), Iss: iss}
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

// Claims are a token's claims; zero fields are left out.
type Claims struct {
	Iss, Sub string
	Aud      []string
	IAT, NBF time.Time
	Exp      time.Time
	NS, SA   string // kubernetes.io claims when set
	// Pod is kubernetes.io.pod.name when set (a pod-bound token); PodClaim forces a
	// pod object even when Pod is empty (a broken token).
	Pod      string
	PodClaim bool
}

// ForPod returns c bound to pod, as a projected token of that pod is.
func (c Claims) ForPod(pod string) Claims {
	c.Pod = pod
	return c
}

// ServiceAccount returns the claims meshctl token mints for ns/sa, valid for ttl from now.
func (i *Issuer) ServiceAccount(ns, sa string, now time.Time, ttl time.Duration) Claims {
	return Claims{Iss: i.Iss, Sub: "system:serviceaccount:" + ns + ":" + sa, Aud: []string{"istio-ca"},
		IAT: now, NBF: now, Exp: now.Add(ttl), NS: ns, SA: sa}
}

// Mint signs c with the issuer's key and kid.
func (i *Issuer) Mint(t testing.TB, c Claims) string {
	t.Helper()
	return MintWith(t, i.Key, i.KID, c)
}

// MintWith signs c with key under kid.
func MintWith(t testing.TB, key crypto.Signer, kid string, c Claims) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	if c.Iss != "" {
		m["iss"] = c.Iss
	}
	if c.Sub != "" {
		m["sub"] = c.Sub
	}
	if len(c.Aud) > 0 {
		m["aud"] = c.Aud
	}
	for k, v := range map[string]time.Time{"iat": c.IAT, "nbf": c.NBF, "exp": c.Exp} {
		if !v.IsZero() {
			m[k] = v.Unix()
		}
	}
	k8s := map[string]any{}
	if c.NS != "" {
		k8s["namespace"] = c.NS
		k8s["serviceaccount"] = map[string]any{"name": c.SA, "uid": "0b3c1b0e-1111-4f7e-9a6b-3c2a8d0f5e77"}
	}
	if c.Pod != "" || c.PodClaim {
		k8s["pod"] = map[string]any{"name": c.Pod, "uid": "7d1e5a2c-2222-4b8f-8c1d-5e6f7a8b9c0d"}
	}
	if len(k8s) > 0 {
		m["kubernetes.io"] = k8s
	}
	tok, err := jwt.Signed(sig).Claims(m).Serialize()
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

// CA is a test CA certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a CA signed by parent (self-signed when parent is nil), valid from now for ttl.
func NewCA(t testing.TB, name string, parent *CA, now time.Time, ttl time.Duration) *CA {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name, Organization: []string{"cluster.local"}},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	pc, pk := tmpl, k
	if parent != nil {
		pc, pk = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, pc, k.Public(), pk)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &CA{Cert: c, Key: k}
}

// WriteCACerts writes an Istio cacerts directory: ca-cert.pem and ca-key.pem from
// signing, cert-chain.pem = signing + chain..., root-cert.pem = roots.
func WriteCACerts(t testing.TB, dir string, signing *CA, chain []*x509.Certificate, roots ...*x509.Certificate) {
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

// Eventually polls cond until it holds or timeout passes (pkg/testkit).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.EventuallyWithin(t, timeout, what, cond)
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
