package authn

import (
	"context"
	"errors"
	"github.com/meshagent/meshagent/pkg/events"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

func TestParseTrustedAccounts(t *testing.T) {
	got, err := ParseTrustedAccounts(" istio-system/ztunnel, kube-system/node-agent ,")
	if err != nil || !slices.Equal(got, []string{"istio-system/ztunnel", "kube-system/node-agent"}) {
		t.Fatalf("got %q, %v", got, err)
	}
	for _, bad := range []string{"ztunnel", "/sa", "ns/", "a/b/c"} {
		if _, err := ParseTrustedAccounts("ok/sa," + bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// An API server that does not answer, or will not let the signer read pods, is no
// verdict (ErrUnavailable: the agent retries), never an admission.
func TestNodeAuthorizerWithoutAnAnswer(t *testing.T) {
	var code atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", int(code.Load()))
	}))
	defer srv.Close()
	n := &NodeAuthorizer{URL: srv.URL, Client: srv.Client(), Trusted: []string{"istio-system/ztunnel"}, TrustDomain: "cluster.local"}
	caller := Caller{ID: &url.URL{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/istio-system/sa/ztunnel"}, Pod: events.PodRef{Namespace: "istio-system", Name: "ztunnel-a"}}
	for c, want := range map[int32]string{503: "503", 403: "may not get and list pods"} {
		code.Store(c)
		_, err := n.Authorize(context.Background(), caller, "spiffe://cluster.local/ns/shop/sa/web")
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), want) {
			t.Errorf("status %d: %v, want ErrUnavailable naming %q", c, err, want)
		}
	}
	code.Store(404)
	if _, err := n.Authorize(context.Background(), caller, "spiffe://cluster.local/ns/shop/sa/web"); !errors.Is(err, ErrPermissionDenied) {
		t.Errorf("caller's pod not found: %v, want ErrPermissionDenied", err)
	}
}
