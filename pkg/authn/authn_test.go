package authn

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/go-jose/go-jose/v4"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

var now = time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)

func verifier(iss *tokentest.Issuer) *JWTVerifier {
	return &JWTVerifier{Keys: StaticKeySet(iss.JWKS()), Issuer: "meshagent-dev", Audience: "istio-ca", TrustDomain: "cluster.local", Clock: clock.NewFake(now)}
}

func TestJWT(t *testing.T) {
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	stranger := tokentest.NewIssuer(t, "meshagent-dev")
	good := iss.ServiceAccount("shop", "web", now.Add(-time.Minute), time.Hour)
	with := func(f func(*tokentest.Claims)) tokentest.Claims { c := good; f(&c); return c }
	tests := []struct {
		name    string
		token   string
		wantID  string
		wantErr string
	}{
		{"dev token", iss.Mint(t, good), "spiffe://cluster.local/ns/shop/sa/web", ""},
		{"sub fallback", iss.Mint(t, with(func(c *tokentest.Claims) { c.NS, c.SA = "", "" })), "spiffe://cluster.local/ns/shop/sa/web", ""},
		{"kubernetes.io claims win over sub", iss.Mint(t, with(func(c *tokentest.Claims) { c.Sub = "system:serviceaccount:other:x" })), "spiffe://cluster.local/ns/shop/sa/web", ""},
		{"expired", iss.Mint(t, iss.ServiceAccount("shop", "web", now.Add(-2*time.Hour), time.Hour)), "", "expired"},
		{"other audience", iss.Mint(t, with(func(c *tokentest.Claims) { c.Aud = []string{"vault"} })), "", "audience"},
		{"other issuer", iss.Mint(t, with(func(c *tokentest.Claims) { c.Iss = "https://evil" })), "", "issuer"},
		{"bad signature", tokentest.MintWith(t, stranger.Key, iss.KID, good), "", "does not verify"},
		{"unknown kid", stranger.Mint(t, good), "", "unknown key id"},
		{"no exp", iss.Mint(t, with(func(c *tokentest.Claims) { c.Exp = time.Time{} })), "", "no exp"},
		{"no service account", iss.Mint(t, with(func(c *tokentest.Claims) { c.NS, c.SA, c.Sub = "", "", "alice" })), "", "no service account"},
		{"not yet valid", iss.Mint(t, with(func(c *tokentest.Claims) { c.NBF = now.Add(time.Hour) })), "", "claims"},
		{"garbage", "not.a.jwt", "", "malformed"},
		{"tampered payload", tamper(iss.Mint(t, good)), "", ""},
	}
	v := verifier(iss)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := v.Verify(tt.token)
			if tt.wantID == "" {
				if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want unauthenticated %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.ID.String() != tt.wantID || c.Source != SourceJWT {
				t.Fatalf("caller %v %s", c.ID, c.Source)
			}
		})
	}
	var none *JWTVerifier
	if _, err := none.Verify(iss.Mint(t, good)); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("nil verifier: %v", err)
	}
}

// tamper swaps the payload for one naming another service account, keeping the signature.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	parts[1] = strings.TrimRight(parts[1], "=") + "x"
	return strings.Join(parts, ".")
}

func TestKeySetFromURLKeepsKeysWhenRefreshFails(t *testing.T) {
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(iss.JWKS())
	}))
	defer srv.Close()
	ks := &KeySet{URL: srv.URL}
	if err := ks.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(ks.Current().Key(iss.KID)) != 1 {
		t.Fatal("key not loaded")
	}
	fail.Store(true)
	if err := ks.Load(context.Background()); err == nil {
		t.Fatal("failed fetch reported no error")
	}
	if len(ks.Current().Key(iss.KID)) != 1 {
		t.Fatal("keys dropped after a failed refresh")
	}
	empty := &KeySet{File: tokentest.NewIssuer(t, "x").WriteJWKS(t, t.TempDir())}
	if err := empty.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	bad := StaticKeySet(jose.JSONWebKeySet{})
	if len(bad.Current().Keys) != 0 {
		t.Fatal("static empty set has keys")
	}
}

func TestVerifyCert(t *testing.T) {
	root := testkit.NewCA(t, "root", nil, now, 24*time.Hour)
	other := testkit.NewCA(t, "other", nil, now, 24*time.Hour)
	k, _ := pki.GenerateKey(pki.ECP256)
	const id = "spiffe://cluster.local/ns/shop/sa/web"
	leaf := root.Issue(t, testkit.Spec{ID: id, Key: k, NotBefore: now, Life: time.Hour}).Cert
	foreign := other.Issue(t, testkit.Spec{ID: id, Key: k, NotBefore: now, Life: time.Hour}).Cert
	tdLeaf := root.Issue(t, testkit.Spec{ID: "spiffe://example.org/ns/shop/sa/web", Key: k, NotBefore: now, Life: time.Hour}).Cert
	roots := []*x509.Certificate{root.Cert}
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		at      time.Time
		wantErr string
	}{
		{"valid", []*x509.Certificate{leaf}, now.Add(time.Minute), ""},
		{"expired", []*x509.Certificate{leaf}, now.Add(2 * time.Hour), "expired"},
		{"other root", []*x509.Certificate{foreign}, now, "unknown authority"},
		{"other trust domain", []*x509.Certificate{tdLeaf}, now, "trust domain"},
		{"none", nil, now, "no client certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := VerifyCert(tt.chain, roots, "cluster.local", x509.VerifyOptions{CurrentTime: tt.at})
			if tt.wantErr != "" {
				if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || c.ID.String() != id || c.Source != SourceX509 {
				t.Fatalf("caller %v %v", c, err)
			}
		})
	}
}
