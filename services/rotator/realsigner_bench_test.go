package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/devtokentest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
)

// signerStack is a nats-server with JetStream on a loopback TCP port, the real
// signer binary on it (its CA, the event stream), and pod-bound service-account
// tokens for meshctl bench sign: token i is pod bench-i's, so that every
// certificate issued with it is recorded for its own pod.
type signerStack struct {
	ns     *server.Server
	signer *testkit.Service
	tokens string // file, one token per line
}

func startSignerStack(b *testing.B, pods int) *signerStack {
	ns := bustest.Server(b)
	iss, signer := devtokentest.StartSigner(b, ns.ClientURL(), "-instance", "rotator-bench")
	var toks strings.Builder
	now := time.Now().Add(-time.Second)
	for i := range pods {
		tok, err := iss.MintForPod("bench", fmt.Sprintf("sa-%d", i%100), fmt.Sprintf("bench-%d", i), "", 2*time.Hour, now)
		if err != nil {
			b.Fatal(err)
		}
		toks.WriteString(tok + "\n")
	}
	tokens := filepath.Join(testkit.ShortDir(b), "tokens")
	if err := os.WriteFile(tokens, []byte(toks.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	return &signerStack{ns: ns, signer: signer, tokens: tokens}
}

// benchSign runs meshctl bench sign against the stack's signer: n CSRs, token i
// for CSR i, with more flags (-warmup, ...).
func (s *signerStack) benchSign(b *testing.B, n int, more ...string) devtokentest.SignBench {
	return devtokentest.BenchSign(b, s.ns.ClientURL(), s.signer, s.tokens, n, more...)
}
