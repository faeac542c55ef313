package signer

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A signer with -token-review checks each request's token with the API server
// (authentication.k8s.io/v1 TokenReview), over NATS and gRPC; an API server that
// does not answer makes the request unavailable (the caller retries), not refused.
func TestSignerVerifiesTokensByTokenReview(t *testing.T) {
	var mu sync.Mutex
	known := map[string]string{} // token -> pod
	down := false
	var reviews atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if down {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		if r.Header.Get("Authorization") != "Bearer signer-token" || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		reviews.Add(1)
		var tr map[string]any
		_ = json.NewDecoder(r.Body).Decode(&tr)
		token, _ := tr["spec"].(map[string]any)["token"].(string)
		st := map[string]any{"authenticated": false, "error": "token lookup failed"}
		if pod, ok := known[token]; ok {
			st = map[string]any{"authenticated": true, "audiences": []string{"istio-ca"}, "user": map[string]any{
				"username": "system:serviceaccount:shop:web", "extra": map[string][]string{"authentication.kubernetes.io/pod-name": {pod}}}}
		}
		tr["status"] = st
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(tr)
	}))
	defer srv.Close()
	dir := t.TempDir()
	caFile, bearer := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bearer, []byte("signer-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	e := newEnv(t)
	cfg := e.config("signer-a")
	cfg.Auth.JWKSFile = ""
	cfg.Auth.TokenReview, cfg.Auth.TokenReviewURL = true, srv.URL
	cfg.Auth.CAFile, cfg.Auth.BearerFile = caFile, bearer
	s := e.start(t, cfg)
	want := "spiffe://cluster.local/ns/shop/sa/web"

	// Over NATS, on web-0's subject: the pod is proved by the API server's pod extra.
	tok := e.token(t, "shop", "web")
	mu.Lock()
	known[tok] = "web-0"
	mu.Unlock()
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	rep := natsSignAs(t, e.nc, "web-0", events.SignRequest{CSR: string(csr), Token: tok, Pod: events.PodRef{Namespace: "shop", Name: "web-0"}})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if leaf := verifyChain(t, rep.CertChain, rep.Roots, time.Now()); leaf.URIs[0].String() != want {
		t.Fatalf("leaf %v", leaf.URIs)
	}
	// Another pod's subject with web-0's token: refused.
	if rep := natsSignAs(t, e.nc, "web-1", events.SignRequest{CSR: string(csr), Token: tok}); rep.Error == nil {
		t.Fatal("web-0's token signed on web-1's subject")
	}
	// Over gRPC, as an Istio agent: the same token, from the cache.
	n := reviews.Load()
	c := istioClient(t, s, rep.Roots, nil, time.Now)
	if _, err := istioCreate(c, tok, "", csr, 3600); err != nil {
		t.Fatal(err)
	}
	if reviews.Load() != n {
		t.Fatal("a token reviewed a moment ago was reviewed again")
	}
	// A token the API server does not know: unauthenticated.
	if _, err := istioCreate(c, e.token(t, "shop", "other"), "", csr, 3600); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unknown token: %v", err)
	}
	// The API server down: unavailable, over both transports.
	fresh := e.token(t, "shop", "web2")
	mu.Lock()
	known[fresh], down = "web-0", true
	mu.Unlock()
	if _, err := istioCreate(c, fresh, "", csr, 3600); status.Code(err) != codes.Unavailable {
		t.Fatalf("API down over gRPC: %v", err)
	}
	if rep := natsSignAs(t, e.nc, "web-0", events.SignRequest{CSR: string(csr), Token: fresh, Pod: events.PodRef{Namespace: "shop", Name: "web-0"}}); rep.Error == nil || rep.Error.Code != events.CodeUnavailable {
		t.Fatalf("API down over NATS: %+v", rep.Error)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	if _, err := istioCreate(c, fresh, "", csr, 3600); err != nil {
		t.Fatalf("API back: %v", err)
	}
}
