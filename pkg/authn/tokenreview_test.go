package authn

import (
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/meshagent/meshagent/pkg/clock"
)

// apiServer speaks the TokenReview API (authentication.k8s.io/v1) over TLS, as the
// Kubernetes API server does: it wants the reviewer's bearer token, and knows a set
// of service-account tokens with their audiences and pods.
type apiServer struct {
	srv    *httptest.Server
	caFile string
	bearer string

	mu     sync.Mutex
	tokens map[string]knownToken
	down   bool

	reviews atomic.Int32
}

type knownToken struct {
	user string
	aud  []string
	pod  string
}

func newAPIServer(t *testing.T) *apiServer {
	t.Helper()
	a := &apiServer{bearer: "signer-sa-token", tokens: map[string]knownToken{}}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	a.caFile = filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(a.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		http.Error(w, "etcdserver: request timed out", http.StatusServiceUnavailable)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+a.bearer {
		http.Error(w, `{"kind":"Status","status":"Failure","reason":"Unauthorized","code":401}`, http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != TokenReviewPath || r.Header.Get("Content-Type") != "application/json" {
		http.NotFound(w, r)
		return
	}
	a.reviews.Add(1)
	var tr tokenReview
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tr); err != nil || tr.APIVersion != "authentication.k8s.io/v1" || tr.Kind != "TokenReview" {
		http.Error(w, "bad TokenReview", http.StatusBadRequest)
		return
	}
	out := tr
	out.Spec.Token = ""
	k, ok := a.tokens[tr.Spec.Token]
	var both []string
	for _, x := range tr.Spec.Audiences {
		if slices.Contains(k.aud, x) {
			both = append(both, x)
		}
	}
	switch {
	case !ok:
		out.Status.Error = "[invalid bearer token, token lookup failed]"
	case len(both) == 0:
		out.Status.Error = "[invalid bearer token, token audiences " + strings.Join(k.aud, ",") + " is invalid for the target audiences " + strings.Join(tr.Spec.Audiences, ",") + "]"
	default:
		out.Status.Authenticated = true
		out.Status.Audiences = both
		out.Status.User.Username = k.user
		out.Status.User.Groups = []string{"system:serviceaccounts", "system:authenticated"}
		if k.pod != "" {
			out.Status.User.Extra = map[string][]string{PodNameExtra: {k.pod}, "authentication.kubernetes.io/pod-uid": {"uid-1"}}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(out)
}

func (a *apiServer) know(token string, k knownToken) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tokens[token] = k
}

func (a *apiServer) setDown(down bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
}

func (a *apiServer) reviewer(t *testing.T, bearer string, fake *clock.Fake) *TokenReviewer {
	t.Helper()
	client, err := NewHTTPClient(a.caFile)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(bearer+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &TokenReviewer{URL: a.srv.URL, Client: client, BearerFile: f, Audience: "istio-ca", TrustDomain: "cluster.local", Clock: fake}
}

func TestTokenReview(t *testing.T) {
	api := newAPIServer(t)
	fake := clock.NewFake(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	iss := tokentest.NewIssuer(t, "https://kubernetes.default.svc.cluster.local")
	mint := func(pod string, aud ...string) string {
		c := iss.ServiceAccount("shop", "web", fake.Now(), time.Hour).ForPod(pod)
		c.Aud = aud
		return iss.Mint(t, c)
	}
	podTok := mint("web-1", "istio-ca")
	api.know(podTok, knownToken{user: "system:serviceaccount:shop:web", aud: []string{"istio-ca"}, pod: "web-1"})
	noPodTok := mint("", "istio-ca")
	api.know(noPodTok, knownToken{user: "system:serviceaccount:shop:web", aud: []string{"istio-ca"}})
	apiAudTok := mint("web-1", "https://kubernetes.default.svc")
	api.know(apiAudTok, knownToken{user: "system:serviceaccount:shop:web", aud: []string{"https://kubernetes.default.svc"}, pod: "web-1"})
	userTok := mint("", "istio-ca")
	api.know(userTok, knownToken{user: "alice@example.com", aud: []string{"istio-ca"}})
	badPodTok := mint("", "istio-ca")
	api.know(badPodTok, knownToken{user: "system:serviceaccount:shop:web", aud: []string{"istio-ca"}, pod: "web.1>"})

	v := api.reviewer(t, api.bearer, fake)
	tests := []struct {
		name, token, want string // want: pod, or the error's text
		ok                bool
	}{
		{"pod-bound token", podTok, "web-1", true},
		{"token without a pod", noPodTok, "", true},
		{"unknown token", "not-a-token", "token lookup failed", false},
		{"wrong audience", apiAudTok, "is invalid for the target audiences istio-ca", false},
		{"not a service account", userTok, "is not a service account's", false},
		{"odd pod name", badPodTok, "token pod", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := v.Verify(tt.token)
			if !tt.ok {
				if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want unauthenticated with %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.ID.String() != "spiffe://cluster.local/ns/shop/sa/web" || c.Pod.Name != tt.want || (tt.want != "" && c.Pod.Namespace != "shop") || c.Source != SourceJWT ||
				!c.Expires.Equal(fake.Now().Add(time.Hour).Truncate(time.Second)) {
				t.Fatalf("caller %+v", c)
			}
		})
	}

	t.Run("cache hit, until the cache time", func(t *testing.T) {
		n := api.reviews.Load()
		for range 3 {
			if _, err := v.Verify(podTok); err != nil {
				t.Fatal(err)
			}
		}
		if got := api.reviews.Load() - n; got != 0 {
			t.Fatalf("%d reviews for cached token", got)
		}
		fake.Add(DefaultReviewCache + time.Second)
		if _, err := v.Verify(podTok); err != nil {
			t.Fatal(err)
		}
		if got := api.reviews.Load() - n; got != 1 {
			t.Fatalf("%d reviews after the cache time, want 1", got)
		}
	})

	t.Run("cached no longer than the token lives", func(t *testing.T) {
		c := iss.ServiceAccount("shop", "web", fake.Now(), 20*time.Second).ForPod("web-2")
		short := iss.Mint(t, c)
		api.know(short, knownToken{user: "system:serviceaccount:shop:web", aud: []string{"istio-ca"}, pod: "web-2"})
		if _, err := v.Verify(short); err != nil {
			t.Fatal(err)
		}
		n := api.reviews.Load()
		fake.Add(21 * time.Second)
		_, _ = v.Verify(short)
		if api.reviews.Load() != n+1 {
			t.Fatal("an expired token's verdict came from the cache")
		}
	})

	t.Run("API down: unavailable, not a verdict, not cached", func(t *testing.T) {
		fresh := mint("web-3", "istio-ca")
		api.know(fresh, knownToken{user: "system:serviceaccount:shop:web", aud: []string{"istio-ca"}, pod: "web-3"})
		api.setDown(true)
		_, err := v.Verify(fresh)
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "503") {
			t.Fatalf("err = %v, want unavailable", err)
		}
		api.setDown(false)
		if c, err := v.Verify(fresh); err != nil || c.Pod.Name != "web-3" {
			t.Fatalf("after the API is back: %+v, %v", c, err)
		}
	})

	t.Run("API unreachable", func(t *testing.T) {
		gone := api.reviewer(t, api.bearer, fake)
		gone.URL = "https://127.0.0.1:1"
		if _, err := gone.Verify(podTok); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err = %v, want unavailable", err)
		}
	})

	t.Run("reviewer not authorized", func(t *testing.T) {
		_, err := api.reviewer(t, "someone-else", fake).Verify(podTok)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "system:auth-delegator") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestInClusterURL(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if got := InClusterURL(env(map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})); got != "https://10.96.0.1:443" {
		t.Fatal(got)
	}
	if got := InClusterURL(env(map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})); got != "https://[fd00::1]:443" {
		t.Fatal(got)
	}
	if got := InClusterURL(env(nil)); got != "" {
		t.Fatal(got)
	}
}
