// Package tokentest mints service-account tokens for tests: a dev token issuer
// (pkg/devtoken, the shape `meshctl token` mints) with its JWKS file, and tokens
// with any claims, valid or broken, for the token verifiers (pkg/authn) and the
// services that use them.
package tokentest

import (
	"crypto"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/meshagent/meshagent/pkg/devtoken"
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
