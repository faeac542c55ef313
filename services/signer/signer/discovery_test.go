package signer

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/go-jose/go-jose/v4"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
)

// A signer configured as in deploy/kubernetes (-token-issuer-discovery with the
// cluster CA and its own token) verifies pods' tokens against the cluster's issuer,
// and accepts a key the issuer rotates in without a restart.
func TestSignerVerifiesTokensByIssuerDiscovery(t *testing.T) {
	var mu sync.Mutex
	var keys jose.JSONWebKeySet
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer signer-token" {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			_ = json.NewEncoder(w).Encode(map[string]string{"issuer": "https://" + r.Host, "jwks_uri": "https://" + r.Host + "/openid/v1/jwks"})
		case "/openid/v1/jwks":
			_ = json.NewEncoder(w).Encode(keys)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	serve := func(iss ...*tokentest.Issuer) {
		mu.Lock()
		defer mu.Unlock()
		keys = jose.JSONWebKeySet{}
		for _, i := range iss {
			keys.Keys = append(keys.Keys, i.JWKS().Keys...)
		}
	}
	dir := t.TempDir()
	caFile, bearer := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	_ = os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	_ = os.WriteFile(bearer, []byte("signer-token"), 0o600)

	first := tokentest.NewIssuer(t, srv.URL)
	serve(first)
	e := newEnv(t)
	cfg := e.config("signer-a")
	cfg.Auth.JWKSFile = ""
	cfg.Auth.Discover, cfg.Auth.Issuer, cfg.Auth.CAFile, cfg.Auth.BearerFile = true, srv.URL, caFile, bearer
	cfg.Auth.JWKSMinRefresh = 0
	e.start(t, cfg)

	sign := func(iss *tokentest.Issuer) *events.ReplyError {
		_, csr := signertest.CSR(t, pki.ECP256, askedID)
		tok := iss.Mint(t, iss.ServiceAccount("shop", "web", time.Now().Add(-time.Second), time.Hour).ForPod("web-0"))
		return natsSignAs(t, e.nc, "web-0", events.SignRequest{CSR: string(csr), Token: tok, TTL: time.Hour, Pod: events.PodRef{Namespace: "shop", Name: "web-0"}, Resource: "default"}).Error
	}
	if err := sign(first); err != nil {
		t.Fatalf("token of the cluster issuer: %v", err)
	}
	stranger := tokentest.NewIssuer(t, srv.URL)
	if err := sign(stranger); err == nil {
		t.Fatal("token signed by a key the issuer does not publish was accepted")
	}
	serve(first, stranger) // the issuer rotates a key in: no restart, no waiting for -jwks-refresh
	if err := sign(stranger); err != nil {
		t.Fatalf("token signed by the rotated-in key: %v", err)
	}
}
