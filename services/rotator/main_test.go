package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestRunServesReadyAndMetrics(t *testing.T) {
	srv := bustest.Server(t)
	// The signer creates the event stream; the rotator waits for it.
	if _, err := bus.EnsureEventStream(context.Background(), bustest.JetStream(t, bustest.Conn(t, srv)), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	addr := testkit.FreeAddr(t)
	stop := testkit.Background(t, func(ctx context.Context) error {
		return run(ctx, []string{"-nats-url", srv.ClientURL(), "-http-addr", addr, "-instance", "main-test", "-log-level", "warn"}, testkit.Env(nil))
	})
	get := func(path string) (int, string) { return testkit.HTTPGet("http://" + addr + path) }
	testkit.Eventually(t, "/readyz 200", func() bool { code, _ := get("/readyz"); return code == http.StatusOK })
	_, metrics := get("/metrics")
	for _, m := range []string{"meshagent_rotator_leader 1", "meshagent_rotator_scheduled 0", "meshagent_rotator_min_time_to_expiry_seconds +Inf"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %q", m)
		}
	}
	stop()
}

func TestRunRejectsBadConfig(t *testing.T) {
	err := run(context.Background(), []string{"-instance", "x", "-rate", "-1"}, testkit.Env(nil))
	if err == nil || !strings.Contains(err.Error(), "-rate") {
		t.Fatalf("got %v", err)
	}
}
