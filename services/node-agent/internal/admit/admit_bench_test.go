package admit

import (
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkAdmit: one pod's admission on its node, as the leaf server asks it
// inside the server: the pod's token verified (ES256 against the JWKS) and its
// permissions made. (The auth callout it replaced also decoded the server's
// request JWT and signed a user JWT and a response: BenchmarkAnswer, ~245 µs.)
func BenchmarkAdmit(b *testing.B) {
	iss, err := devtoken.Generate()
	if err != nil {
		b.Fatal(err)
	}
	iss.Name = "meshagent-dev"
	v := &authn.JWTVerifier{Keys: authn.StaticKeySet(iss.KeySet()), Issuer: "meshagent-dev", Audience: devtoken.DefaultAudience, TrustDomain: "cluster.local"}
	a := New("node-a", Tokens{Verifier: v}, policy.DefaultPodLimits(), clock.Real{}, hclog.NewNullLogger(), prometheus.NewRegistry())
	tok, err := iss.MintForPodOnNode("shop", "web", "web-0", "node-a", devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Admit(embedded.LeafClient{Token: tok}); err != nil {
			b.Fatal(err)
		}
	}
}
