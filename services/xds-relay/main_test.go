package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/testkit"
)

// TestRunServesAndStops runs the real binary's run: it is ready once the socket is
// bound, with no upstream reachable (as Istio), and returns nil on cancellation.
func TestRunServesAndStops(t *testing.T) {
	ns := bustest.Server(t)
	root := testkit.ShortDir(t)
	httpAddr := testkit.FreeAddr(t)
	stop := testkit.Background(t, func(ctx context.Context) error {
		return run(ctx, []string{"-pod", "web-0", "-pod-root", root, "-discovery-address", testkit.FreeAddr(t),
			"-xds-tls", "plaintext", "-nats-url", ns.ClientURL(), "-http-addr", httpAddr, "-log-level", "warn"},
			testkit.Env(nil))
	})
	testkit.Eventually(t, "/readyz 200", func() bool {
		code, body := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == http.StatusOK && strings.Contains(body, "ready")
	})
	fi, err := os.Stat(filepath.Join(root, "etc/istio/proxy/XDS"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a 0600 socket", fi.Mode())
	}
	if _, body := testkit.HTTPGet("http://" + httpAddr + "/metrics"); !strings.Contains(body, "meshagent_xds_relay_upstream_connect_failures_total") {
		t.Fatal("relay metrics missing from /metrics")
	}
	stop()
}

func TestRunRejectsBadConfig(t *testing.T) {
	err := run(context.Background(), []string{"-xds-tls", "carrier-pigeon"}, testkit.Env(nil))
	if err == nil || !strings.Contains(err.Error(), "-xds-tls") || !strings.Contains(err.Error(), "-pod") {
		t.Fatalf("err = %v", err)
	}
}
