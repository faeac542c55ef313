package authn

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"
)

func TestJWTPodClaim(t *testing.T) {
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	sa := iss.ServiceAccount("shop", "web", now.Add(-time.Minute), time.Hour)
	tests := []struct {
		name    string
		claims  tokentest.Claims
		wantPod string
		wantErr string
	}{
		{"pod-bound token", sa.ForPod("web-0"), "web-0", ""},
		{"token without pod claim", sa, "", ""},
		{"pod claim without service account claims", func() tokentest.Claims { c := sa.ForPod("web-1"); c.NS, c.SA = "", ""; return c }(), "web-1", ""},
		{"empty pod name", func() tokentest.Claims { c := sa; c.PodClaim = true; return c }(), "", "token pod claim"},
		{"pod name with a slash", sa.ForPod("shop/web-0"), "", "token pod claim"},
	}
	v := verifier(iss)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := v.Verify(iss.Mint(t, tt.claims))
			if tt.wantErr != "" {
				if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want unauthenticated %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Pod.Name != tt.wantPod || (tt.wantPod != "" && c.Pod.Namespace != "shop") || c.ID.String() != "spiffe://cluster.local/ns/shop/sa/web" {
				t.Fatalf("caller %v pod %q, want pod %q", c.ID, c.Pod, tt.wantPod)
			}
		})
	}
}
