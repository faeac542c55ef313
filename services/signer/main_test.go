package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestRunServesUntilCancelled(t *testing.T) {
	s := bustest.Server(t)
	jwks := tokentest.NewIssuer(t, "meshagent-dev").WriteJWKS(t, t.TempDir())
	httpAddr := testkit.FreeAddr(t)
	env := map[string]string{"NATS_URL": s.ClientURL(), "JWKS_FILE": jwks, "CA_KEK_FILE": signertest.KEKFile(t)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-instance", "main-test", "-http-addr", httpAddr, "-grpc-addr", testkit.FreeAddr(t), "-log-level", "warn"}, func(k string) string { return env[k] })
	}()
	testkit.EventuallyWithin(t, 20*time.Second, "/readyz 200", func() bool {
		code, body := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == 200 && strings.TrimSpace(body) == "ready"
	})
	if code, body := testkit.HTTPGet("http://" + httpAddr + "/metrics"); code != 200 || !strings.Contains(body, "meshagent_signer_nats_requests_dropped_total") {
		t.Fatalf("/metrics %d without the signer's metrics:\n%s", code, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testkit.Timeout):
		t.Fatal("run did not return after cancel")
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	err := run(context.Background(), []string{"-max-ttl", "1h", "-trust-domain", "BAD DOMAIN"}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "-max-ttl") || !strings.Contains(err.Error(), "-trust-domain") {
		t.Fatalf("err = %v", err)
	}
}

// Ctrl-C while waiting for NATS exits cleanly (status 0), not with an error.
func TestRunReturnsNilWhenInterruptedWhileConnecting(t *testing.T) {
	env := map[string]string{"NATS_URL": "nats://" + testkit.FreeAddr(t), "CA_KEK_FILE": signertest.KEKFile(t)} // nothing listens there
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := run(ctx, []string{"-instance", "main-test", "-log-level", "off"}, func(k string) string { return env[k] }); err != nil {
		t.Fatalf("run interrupted while connecting: %v", err)
	}
}
