package devtokentest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// The real signer, started on a real nats-server, signs for tokens of the issuer
// StartSigner made, as meshctl bench sign measures it.
func TestStartSignerSignsForItsIssuersTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the signer and meshctl")
	}
	ns := bustest.Server(t).ClientURL()
	// One pod's token asks twenty times at once: the signer's bound on a pod's early
	// certificates (10 a minute) refuses the eleventh that lands after ten are
	// recorded, which depends on how the requests interleave. The bound is not what
	// this test is about (issuer's reissue tests are).
	iss, signer := StartSigner(t, ns, "-instance", "devtokentest", "-max-early-certs-per-minute", "0")
	tok, err := iss.MintForPod("default", "web", "web-0", "", time.Hour, time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(testkit.ShortDir(t), "tokens")
	if err := os.WriteFile(tokens, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := BenchSign(t, ns, signer, tokens, 20, "-warmup", "0")
	if r.CSRs != 20 || r.Rate <= 0 || r.P50Micro <= 0 {
		t.Fatalf("bench sign: %+v", r)
	}
}
