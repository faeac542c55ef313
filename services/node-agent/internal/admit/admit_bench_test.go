package admit

import (
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkAnswer: one pod's admission on its node, as the leaf server asks it:
// the server's request decoded, the pod's token verified (ES256 against the
// JWKS), and the user JWT and the response signed (two Ed25519 signatures).
func BenchmarkAnswer(b *testing.B) {
	iss, err := devtoken.Generate()
	if err != nil {
		b.Fatal(err)
	}
	iss.Name = "meshagent-dev"
	v := &authn.JWTVerifier{Keys: authn.StaticKeySet(iss.KeySet()), Issuer: "meshagent-dev", Audience: devtoken.DefaultAudience, TrustDomain: "cluster.local"}
	made, _ := nkeys.CreateAccount()
	issuer, err := policy.FastSigner(made)
	if err != nil {
		b.Fatal(err)
	}
	c := New("node-a", issuer, Tokens{Verifier: v}, policy.DefaultPodLimits(), 5*time.Second, clock.Real{}, hclog.NewNullLogger(), prometheus.NewRegistry())
	tok, err := iss.MintForPodOnNode("shop", "web", "web-0", "node-a", devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	server, _ := nkeys.CreateServer()
	spub, _ := server.PublicKey()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	req := jwt.NewAuthorizationRequestClaims(upub)
	req.Server.ID = spub
	req.UserNkey = upub
	req.ConnectOptions.Token = tok
	data, err := req.Encode(server)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Answer([]byte(data)); err != nil {
			b.Fatal(err)
		}
	}
}
