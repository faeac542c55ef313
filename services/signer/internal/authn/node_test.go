package authn

import (
	"slices"
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
