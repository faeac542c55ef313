package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/services/signer/internal/testkit"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestRunServesUntilCancelled(t *testing.T) {
	s := bustest.Server(t)
	jwks := testkit.NewIssuer(t, "meshagent-dev").WriteJWKS(t, t.TempDir())
	httpAddr := freeAddr(t)
	env := map[string]string{"NATS_URL": s.ClientURL(), "JWKS_FILE": jwks, "CA_KEK_FILE": testkit.KEKFile(t)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-instance", "main-test", "-http-addr", httpAddr, "-grpc-addr", freeAddr(t), "-log-level", "warn"}, func(k string) string { return env[k] })
	}()
	testkit.Eventually(t, 20*time.Second, "/readyz 200", func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && strings.TrimSpace(string(b)) == "ready"
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
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
	env := map[string]string{"NATS_URL": "nats://" + freeAddr(t), "CA_KEK_FILE": testkit.KEKFile(t)} // nothing listens there
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := run(ctx, []string{"-instance", "main-test", "-log-level", "off"}, func(k string) string { return env[k] }); err != nil {
		t.Fatalf("run interrupted while connecting: %v", err)
	}
}
