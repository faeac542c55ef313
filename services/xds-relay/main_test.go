package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
)

// TestRunServesAndStops runs the real binary's run: it binds the socket at once
// (as Istio), is not ready until a real discovery server that starts late is
// reached, and returns nil on cancellation.
func TestRunServesAndStops(t *testing.T) {
	ns := bustest.Server(t)
	root := testkit.ShortDir(t)
	httpAddr, xdsAddr, tapAddr := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	_, tapPort, _ := net.SplitHostPort(tapAddr)
	stop := testkit.Background(t, func(ctx context.Context) error {
		return run(ctx, []string{"-pod", "web-0", "-pod-root", root, "-discovery-address", xdsAddr,
			"-xds-tls", "plaintext", "-nats-url", ns.ClientURL(), "-http-addr", httpAddr, "-log-level", "warn"},
			testkit.Env(map[string]string{"PROXY_XDS_DEBUG_VIA_AGENT_PORT": tapPort}))
	})
	testkit.Eventually(t, "/readyz 503 naming the upstream", func() bool {
		code, body := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "upstream: "+xdsAddr+" not reachable (")
	})
	if _, body := testkit.HTTPGet("http://" + httpAddr + "/metrics"); !strings.Contains(body, "meshagent_xds_relay_upstream_connected 0") {
		t.Fatal("upstream gauge not 0 before the server is up")
	}
	ln, err := net.Listen("tcp", xdsAddr)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs,
		xdsserver.NewServer(context.Background(), cache.NewSnapshotCache(true, cache.IDHash{}, nil), nil))
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	testkit.Eventually(t, "/readyz 200", func() bool {
		code, body := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == http.StatusOK && strings.Contains(body, "ready")
	})
	// The debug tap (PROXY_XDS_DEBUG_VIA_AGENT, on by default) listens on the
	// port PROXY_XDS_DEBUG_VIA_AGENT_PORT names; with no Envoy connected it says so.
	if code, body := testkit.HTTPGet("http://" + tapAddr + "/debug/syncz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "Envoy is not connected") {
		t.Fatalf("debug tap: %d %q, want 503 saying Envoy is not connected", code, body)
	}
	fi, err := os.Stat(filepath.Join(root, "etc/istio/proxy/XDS"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a 0600 socket", fi.Mode())
	}
	if _, body := testkit.HTTPGet("http://" + httpAddr + "/metrics"); !strings.Contains(body, "meshagent_xds_relay_upstream_connect_failures_total") ||
		!strings.Contains(body, "meshagent_xds_relay_upstream_connected 1") {
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
