package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunServesDashboardReadyAndMetrics: two replicas of the operator, each run
// the way its binary runs (lifecycle.Serve), on the secured bus with the inventory
// role's nkey. Neither is ready before the signer has made the event stream; then
// each serves the page, /healthz, /readyz and /metrics (the fleet's and the
// process's) on its one listener, and both show a certificate issued once.
func TestRunServesDashboardReadyAndMetrics(t *testing.T) {
	m := bustest.SecureServer(t)
	var addrs []string
	for i, name := range []string{"op-0", "op-1"} {
		addrs = append(addrs, testkit.FreeAddr(t))
		args := []string{"-nats-url", m.Server.ClientURL(), "-nats-nkey", m.Creds.SeedFile(policy.Inventory),
			"-http-addr", addrs[i], "-instance", name, "-log-level", "warn"}
		testkit.Background(t, func(ctx context.Context) error { return run(ctx, args, testkit.Env(nil)) })
	}
	get := func(i int, path string) (int, string) { return testkit.HTTPGet("http://" + addrs[i] + path) }
	for i := range addrs {
		// /healthz answers from the start (also while the bus is awaited); the
		// inventory's check is there once the service is built.
		testkit.Eventually(t, "/healthz 200 and the service built", func() bool {
			code, _ := get(i, "/healthz")
			_, ready := get(i, "/readyz")
			return code == http.StatusOK && strings.Contains(ready, "inventory")
		})
		if code, body := get(i, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "inventory") {
			t.Fatalf("replica %d ready with no event stream: %d %q", i, code, body)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	js := bustest.JetStream(t, signer)
	if _, err := bus.EnsureEventStream(ctx, js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i := range addrs {
		testkit.Eventually(t, "/readyz 200", func() bool { code, _ := get(i, "/readyz"); return code == http.StatusOK })
		if code, body := get(i, "/"); code != http.StatusOK || !strings.Contains(body, `<script src="app.js">`) {
			t.Fatalf("replica %d page: %d %q", i, code, body)
		}
	}

	now := time.Now()
	msg, err := events.NewMsg(events.SubjectCertIssued, "signer-0", events.CertIssued{Serial: "0a7e12", SPIFFEID: "spiffe://td/ns/a/sa/web",
		NotBefore: now, NotAfter: now.Add(3 * time.Hour), Pod: events.PodRef{Namespace: "default", Name: "web-0"}, KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Publish(ctx, js, msg); err != nil {
		t.Fatal(err)
	}
	for i := range addrs {
		testkit.Eventually(t, "the inventory API lists web-0", func() bool {
			code, body := get(i, "/api/inventory")
			return code == http.StatusOK && strings.Contains(body, `"serial":"0a7e12"`)
		})
		testkit.Eventually(t, "/metrics counts it beside the process's own metrics", func() bool {
			_, body := get(i, "/metrics")
			return strings.Contains(body, `meshagent_fleet_certificates{expires_in="6h"} 1`) && strings.Contains(body, "go_goroutines ")
		})
	}
}

// TestRunRejectsBadConfig: every bad flag is named, and nothing is served.
func TestRunRejectsBadConfig(t *testing.T) {
	addr := testkit.FreeAddr(t)
	err := run(context.Background(), []string{"-http-addr", addr, "-instance", "x", "-bucket-replicas", "9", "-history", "0s"}, testkit.Env(nil))
	if err == nil || !strings.Contains(err.Error(), "-bucket-replicas") || !strings.Contains(err.Error(), "-history") {
		t.Fatalf("got %v", err)
	}
	if code, _ := testkit.HTTPGet("http://" + addr + "/healthz"); code != 0 {
		t.Fatalf("something answers on %s after a refused config: %d", addr, code)
	}
}
