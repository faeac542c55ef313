package envoy

import (
	"strings"
	"testing"
	"time"
)

// Envoy gets the arguments Istio's agent gives it.
func TestArgsAreIstios(t *testing.T) {
	args := strings.Join(Args(Options{ConfigPath: "/etc/istio/proxy/envoy-rev.json", DrainDuration: 45 * time.Second,
		ParentShutdown: time.Minute, IPv6: true, LogLevel: "warning", ComponentLevel: "misc:error", Concurrency: 2,
		Extra: []string{"--service-cluster", "x"}}), " ")
	for _, w := range []string{"-c /etc/istio/proxy/envoy-rev.json", "--drain-time-s 45", "--drain-strategy immediate",
		"--parent-shutdown-time-s 60", "--local-address-ip-version v6", "--file-flush-interval-msec 1000",
		"--disable-hot-restart", "--log-format %Y-%m-%dT%T.%fZ", "-l warning", "--component-log-level misc:error",
		"--concurrency 2", "--service-cluster x"} {
		if !strings.Contains(args, w) {
			t.Errorf("args lack %q: %s", w, args)
		}
	}
	if a := strings.Join(Args(Options{ConfigPath: "c", LogJSON: true}), " "); !strings.Contains(a, `--log-format {"level":"%l"`) ||
		!strings.Contains(a, "v4") || strings.Contains(a, "--concurrency") {
		t.Errorf("json/v4/no concurrency: %s", a)
	}
}

// Active connections are the app's: the admin and the stats listener are left out.
func TestSumActiveLeavesOutAdminAndExcluded(t *testing.T) {
	stats := `http.admin.downstream_cx_active: 5
listener.0.0.0.0_15006.downstream_cx_active: 2
listener.0.0.0.0_15001.downstream_cx_active: 1
listener.0.0.0.0_15090.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.0.0.0.0_15006.downstream_cx_total: 40
server.total_connections: 9
`
	n, err := SumActive(strings.NewReader(stats), "0.0.0.0_15090")
	if err != nil || n != 3 {
		t.Fatalf("SumActive = %d, %v; want 3", n, err)
	}
	if _, err := SumActive(strings.NewReader("listener.x.downstream_cx_active: many\n")); err == nil {
		t.Fatal("garbled stat accepted")
	}
}
