package authn

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/go-jose/go-jose/v4"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
)

// clusterIssuer is a Kubernetes API server as far as token verification goes: an
// HTTPS server with the service-account issuer's discovery document and JWKS, which
// wants the caller's bearer token, as the API server does.
type clusterIssuer struct {
	srv    *httptest.Server
	caFile string
	bearer string

	mu          sync.Mutex
	keys        jose.JSONWebKeySet
	docIssuer   string // issuer named in the discovery document; "" = the server's URL
	jwksURI     string // "" = the server's /openid/v1/jwks
	failDiscovr bool

	discoveries, jwksFetches atomic.Int32
}

func newClusterIssuer(t *testing.T) *clusterIssuer {
	t.Helper()
	c := &clusterIssuer{bearer: "signer-sa-token"}
	c.srv = httptest.NewTLSServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	c.caFile = filepath.Join(t.TempDir(), "ca.crt")
	pemCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.srv.Certificate().Raw})
	if err := os.WriteFile(c.caFile, pemCA, 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *clusterIssuer) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+c.bearer {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		c.discoveries.Add(1)
		if c.failDiscovr {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		iss, uri := c.docIssuer, c.jwksURI
		if iss == "" {
			iss = c.srv.URL
		}
		if uri == "" {
			uri = c.srv.URL + "/openid/v1/jwks"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"issuer": iss, "jwks_uri": uri,
			"response_types_supported": []string{"id_token"}, "subject_types_supported": []string{"public"},
			"id_token_signing_alg_values_supported": []string{"ES256"}})
	case "/openid/v1/jwks":
		c.jwksFetches.Add(1)
		// As the API server: only application/jwk-set+json, else 406.
		if !strings.Contains(r.Header.Get("Accept"), "application/jwk-set+json") {
			http.Error(w, "not acceptable", http.StatusNotAcceptable)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_ = json.NewEncoder(w).Encode(c.keys)
	default:
		http.NotFound(w, r)
	}
}

func (c *clusterIssuer) set(f func(c *clusterIssuer)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

// serveKeys makes the JWKS hold exactly the keys of issuers.
func (c *clusterIssuer) serveKeys(issuers ...*tokentest.Issuer) {
	var set jose.JSONWebKeySet
	for _, i := range issuers {
		set.Keys = append(set.Keys, i.JWKS().Keys...)
	}
	c.set(func(c *clusterIssuer) { c.keys = set })
}

// keySet is the signer's view of the cluster issuer, as service.New builds it.
func (c *clusterIssuer) keySet(t *testing.T, fake *clock.Fake) *KeySet {
	t.Helper()
	client, err := NewHTTPClient(c.caFile)
	if err != nil {
		t.Fatal(err)
	}
	bearer := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(bearer, []byte(c.bearer+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &KeySet{Discover: true, Issuer: c.srv.URL, BearerFile: bearer, Client: client,
		MinRefresh: 10 * time.Second, Clock: fake}
}

func clusterVerifier(ks *KeySet, iss string, fake *clock.Fake) *JWTVerifier {
	return &JWTVerifier{Keys: ks, Issuer: iss, Audience: "istio-ca", TrustDomain: "cluster.local", Clock: fake}
}

// loadedDiscovery is a cluster issuer serving the key of iss, and the signer's key
// set (loaded) and verifier for it, on a fake clock.
func loadedDiscovery(t *testing.T) (cluster *clusterIssuer, iss *tokentest.Issuer, fake *clock.Fake, ks *KeySet, v *JWTVerifier) {
	t.Helper()
	cluster = newClusterIssuer(t)
	iss = tokentest.NewIssuer(t, cluster.srv.URL)
	cluster.serveKeys(iss)
	fake = clock.NewFake(now)
	ks = cluster.keySet(t, fake)
	if err := ks.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cluster, iss, fake, ks, clusterVerifier(ks, cluster.srv.URL, fake)
}

func TestDiscoveryVerifiesClusterTokens(t *testing.T) {
	_, sa, _, _, v := loadedDiscovery(t)
	c, err := v.Verify(sa.Mint(t, sa.ServiceAccount("shop", "web", now.Add(-time.Minute), time.Hour).ForPod("web-0")))
	if err != nil {
		t.Fatal(err)
	}
	if c.ID.String() != "spiffe://cluster.local/ns/shop/sa/web" || c.Pod != (events.PodRef{Namespace: "shop", Name: "web-0"}) {
		t.Fatalf("caller %v pod %q", c.ID, c.Pod)
	}
	// The issuer's name is checked in the token as well: the same key under another iss is refused.
	other := *sa
	other.Iss = "https://kubernetes.default.svc.cluster.local"
	if _, err := v.Verify(other.Mint(t, other.ServiceAccount("shop", "web", now.Add(-time.Minute), time.Hour))); err == nil || !strings.Contains(err.Error(), "issuer") {
		t.Fatalf("token of another issuer: %v", err)
	}
}

func TestDiscoveryUnknownKidRefetchesAtMostOncePerMinRefresh(t *testing.T) {
	cluster, old, fake, _, v := loadedDiscovery(t)
	fetches := func() int32 { return cluster.jwksFetches.Load() }
	if fetches() != 1 {
		t.Fatalf("%d JWKS fetches after Load, want 1", fetches())
	}

	// The API server rotates its signing key; the first token with the new kid makes
	// the signer fetch the JWKS again (the minimum interval has passed since Load).
	fake.Add(11 * time.Second)
	rotated := tokentest.NewIssuer(t, cluster.srv.URL)
	cluster.serveKeys(old, rotated)
	if _, err := v.Verify(rotated.Mint(t, rotated.ServiceAccount("shop", "web", fake.Now(), time.Hour))); err != nil {
		t.Fatalf("token signed by the rotated-in key: %v", err)
	}
	if fetches() != 2 {
		t.Fatalf("%d JWKS fetches after a new kid, want 2", fetches())
	}

	// Made-up key ids, many of them at once, within the minimum interval: no fetch.
	stranger := tokentest.NewIssuer(t, cluster.srv.URL)
	forged := stranger.Mint(t, stranger.ServiceAccount("shop", "web", fake.Now(), time.Hour))
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := v.Verify(forged); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "unknown key id") {
				t.Errorf("forged token: %v", err)
			}
		}()
	}
	wg.Wait()
	if fetches() != 2 {
		t.Fatalf("%d JWKS fetches after unknown kids within the minimum interval, want 2", fetches())
	}
	// A key rotated in within the minimum interval waits for it to pass.
	next := tokentest.NewIssuer(t, cluster.srv.URL)
	cluster.serveKeys(old, rotated, next)
	tok := next.Mint(t, next.ServiceAccount("shop", "web", fake.Now(), time.Hour))
	if _, err := v.Verify(tok); err == nil {
		t.Fatal("a new kid within the minimum interval verified without a fetch")
	}
	fake.Add(10 * time.Second)
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("new kid once the minimum interval passed: %v", err)
	}
	if fetches() != 3 {
		t.Fatalf("%d JWKS fetches, want 3", fetches())
	}
	// Concurrent unknown kids after the interval share one fetch.
	fake.Add(10 * time.Second)
	for range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = v.Verify(forged) }()
	}
	wg.Wait()
	if fetches() != 4 {
		t.Fatalf("%d JWKS fetches after 20 concurrent unknown kids, want 4", fetches())
	}
}

func TestDiscoveryRefreshReplacesKeysEveryTTL(t *testing.T) {
	cluster := newClusterIssuer(t)
	old, rotated := tokentest.NewIssuer(t, cluster.srv.URL), tokentest.NewIssuer(t, cluster.srv.URL)
	cluster.serveKeys(old)
	fake := clock.NewFake(now)
	ks := cluster.keySet(t, fake)
	ks.Refresh = 20 * time.Millisecond
	if err := ks.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ks.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// The issuer retires the old key: the cached set follows within the TTL, without
	// any token asking for it, once the TTL has passed on the set's clock.
	cluster.serveKeys(rotated)
	testkit.EventuallyWithin(t, 30*time.Second, "the cached set refreshed to the rotated key", func() bool {
		fake.Add(ks.Refresh)
		return len(ks.Current().Key(old.KID)) == 0 && len(ks.Current().Key(rotated.KID)) == 1
	})
}

func TestDiscoveryRefusesAndKeepsKeys(t *testing.T) {
	cluster, sa, _, ks, v := loadedDiscovery(t)
	token := sa.Mint(t, sa.ServiceAccount("shop", "web", now.Add(-time.Minute), time.Hour))
	imposter := tokentest.NewIssuer(t, cluster.srv.URL)
	cluster.serveKeys(imposter)

	tests := []struct {
		name    string
		setup   func(c *clusterIssuer)
		wantErr string
	}{
		{"issuer mismatch", func(c *clusterIssuer) { c.docIssuer = "https://evil.example" }, `document is for issuer "https://evil.example"`},
		{"issuer with a trailing slash", func(c *clusterIssuer) { c.docIssuer = c.srv.URL + "/" }, "document is for issuer"},
		{"plain http jwks_uri", func(c *clusterIssuer) {
			c.jwksURI = "http://" + strings.TrimPrefix(c.srv.URL, "https://") + "/openid/v1/jwks"
		}, "not an https URL"},
		{"discovery unreachable", func(c *clusterIssuer) { c.failDiscovr = true }, "oidc discovery: GET " + cluster.srv.URL + "/.well-known/openid-configuration: 503"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cluster.set(func(c *clusterIssuer) { c.docIssuer, c.jwksURI, c.failDiscovr = "", "", false; tt.setup(c) })
			err := ks.Load(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Load: %v, want %q", err, tt.wantErr)
			}
			if len(ks.Current().Key(imposter.KID)) != 0 {
				t.Fatal("keys of a refused document were loaded")
			}
			if _, err := v.Verify(token); err != nil {
				t.Fatalf("the loaded keys were dropped: %v", err)
			}
		})
	}
}

func TestDiscoveryClearErrors(t *testing.T) {
	cluster := newClusterIssuer(t)
	cluster.serveKeys(tokentest.NewIssuer(t, cluster.srv.URL))
	fake := clock.NewFake(now)

	untrusted := cluster.keySet(t, fake)
	untrusted.Client = &http.Client{Timeout: time.Second} // system roots: the cluster CA is not among them
	if err := untrusted.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("unknown server CA: %v", err)
	}
	noBearer := cluster.keySet(t, fake)
	noBearer.BearerFile = ""
	if err := noBearer.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Fatalf("no bearer token: %v", err)
	}
	missing := cluster.keySet(t, fake)
	missing.BearerFile = filepath.Join(t.TempDir(), "absent")
	if err := missing.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "bearer token") {
		t.Fatalf("missing bearer file: %v", err)
	}
	plain := cluster.keySet(t, fake)
	plain.Issuer = "http://kubernetes.default.svc"
	if err := plain.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "not an https URL") {
		t.Fatalf("http issuer: %v", err)
	}
	gone := cluster.keySet(t, fake)
	cluster.srv.Close()
	if err := gone.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "oidc discovery") {
		t.Fatalf("server gone: %v", err)
	}
	if _, err := NewHTTPClient(filepath.Join(t.TempDir(), "none.crt")); err == nil {
		t.Fatal("missing CA file accepted")
	}
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	_ = os.WriteFile(notPEM, []byte("junk"), 0o600)
	if _, err := NewHTTPClient(notPEM); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("junk CA file: %v", err)
	}
}
