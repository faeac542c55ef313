package launcher_test

import (
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/launcher/internal/envoy"
	"github.com/meshagent/meshagent/tests/testkit"
)

// Envoy starts only once sds-edge holds default and ROOTCA and the relay has its
// upstream; until then the launcher is not ready and says what it waits for.
func TestEnvoyStartsOnlyWhenCertificatesAndRelayAreThere(t *testing.T) {
	p := newPod(t)
	s := p.start(p.args()...)
	status := func() (int, string) {
		if s.l.StatusAddr() == "" {
			return 0, ""
		}
		return testkit.HTTPGet("http://" + s.l.StatusAddr() + "/healthz/ready")
	}
	testkit.Eventually(t, "status port up and not ready", func() bool {
		code, body := status()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "certificate default") &&
			strings.Contains(body, "ROOTCA") && strings.Contains(body, "xds-relay has no upstream")
	})
	testkit.Eventually(t, "an INFO line saying what the launcher waits for", func() bool {
		return strings.Contains(p.log.String(), "[INFO]  gate: waiting before starting envoy: missing=")
	})
	p.relayReady.Store(true)
	// The relay alone is not enough: the signer has not answered sds-edge yet.
	testkit.Eventually(t, "only the certificates missing", func() bool {
		_, body := status()
		return !strings.Contains(body, "xds-relay") && strings.Contains(body, "certificate default")
	})
	if has[events.EnvoyStarted](p) {
		t.Fatal("envoy started before sds-edge had a certificate")
	}
	p.giveSecrets()
	started := event[events.EnvoyStarted](t, p)
	if started.PID <= 0 || !strings.Contains(started.Version, "envoy-standin") {
		t.Fatalf("started %+v", started)
	}
	for _, a := range []string{"--drain-strategy", "--parent-shutdown-time-s", "--local-address-ip-version", "--disable-hot-restart"} {
		if !strings.Contains(strings.Join(started.Args, " "), a) {
			t.Errorf("envoy args %v lack %s", started.Args, a)
		}
	}
	ready := event[events.EnvoyReady](t, p)
	if ready.PID != started.PID {
		t.Fatalf("ready %+v for started %+v", ready, started)
	}
	testkit.Eventually(t, "status /healthz/ready 200", func() bool { code, _ := status(); return code == http.StatusOK })
	// The bootstrap Envoy got names the pod as Istio does.
	data, err := os.ReadFile(s.cfg.Envoy.BootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"sidecar~127.0.0.1~web-0.default~default.svc.cluster.local"`, `"sds-grpc"`, `"xds-grpc"`, `"prometheus_stats"`} {
		if !strings.Contains(string(data), w) {
			t.Errorf("bootstrap lacks %s", w)
		}
	}
}

// The bound on the wait ends the launcher with an error naming what is missing.
func TestWaitIsBoundedAndNamesWhatIsMissing(t *testing.T) {
	p := newPod(t)
	p.relayReady.Store(true)
	s := p.start(p.args("-wait-for", "300ms")...)
	err := s.wait(t)
	if err == nil || !strings.Contains(err.Error(), "certificate default") || !strings.Contains(err.Error(), "ROOTCA") ||
		strings.Contains(err.Error(), "xds-relay") {
		t.Fatalf("Run = %v", err)
	}
	if has[events.EnvoyStarted](p) {
		t.Fatal("envoy started")
	}
}

// Holding default is not enough when sds-edge says it is expired: the gate asks
// sds-edge's readiness, which judges the certificate, and names its answer.
func TestExpiredCertificateHoldsEnvoyBack(t *testing.T) {
	p := newPod(t)
	p.relayReady.Store(true)
	p.giveSecrets()
	p.sdsExpired.Store(true)
	s := p.start(p.args("-wait-for", "300ms")...)
	err := s.wait(t)
	if err == nil || !strings.Contains(err.Error(), "sds-edge not ready") || !strings.Contains(err.Error(), "expired certificate") {
		t.Fatalf("Run = %v", err)
	}
	if has[events.EnvoyStarted](p) {
		t.Fatal("envoy started on an expired certificate")
	}
}

// startReady starts a launcher on a pod that has everything and waits for Envoy.
func startReady(t *testing.T, args ...string) (*pod, *started, events.EnvoyStarted) {
	p := newPod(t)
	p.relayReady.Store(true)
	p.giveSecrets()
	s := p.start(p.args(args...)...)
	st := event[events.EnvoyStarted](t, p)
	event[events.EnvoyReady](t, p)
	return p, s, st
}

// With EXIT_ON_ZERO_ACTIVE_CONNECTIONS and no connection, the drain ends as soon as
// the minimum has passed: zero connections.
func TestDrainToZeroWithoutConnections(t *testing.T) {
	p, s, st := startReady(t, "-exit-on-zero-active-connections", "-minimum-drain-duration", "0s", "-drain-poll-interval", "20ms")
	s.cancel()
	if err := s.wait(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	d := event[events.EnvoyDraining](t, p)
	if d.Strategy != events.DrainZeroConnections || d.PID != st.PID || d.Reason != "SIGTERM" {
		t.Fatalf("draining %+v", d)
	}
	x := event[events.EnvoyExited](t, p)
	if x.Drain != events.DrainZeroReached || x.ActiveConnections != 0 || x.Crashed || x.Code != 0 {
		t.Fatalf("exited %+v", x)
	}
}

// inboundTemplate is a bootstrap template (ISTIO_BOOTSTRAP) with one inbound
// listener the test connects to, beside the admin and the SDS and ADS clusters.
func inboundTemplate(t *testing.T, dir, addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	tmpl := `{
  "node": {"id": "{{.NodeID}}", "cluster": "{{.Cluster}}"},
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": {{port .AdminAddr}}}}},
  "static_resources": {
    "listeners": [{"name": "inbound", "traffic_direction": "INBOUND",
      "address": {"socket_address": {"address": "` + host + `", "port_value": ` + port + `}}}],
    "clusters": [
      {"name": "sds-grpc", "load_assignment": {"cluster_name": "sds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": "{{.SDSSocket}}"}}}}]}]}},
      {"name": "xds-grpc", "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": "{{.XDSSocket}}"}}}}]}]}}
    ]
  }
}`
	path := filepath.Join(dir, "bootstrap.tmpl")
	if err := os.WriteFile(path, []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// holdConnection opens a connection to addr and checks it is served (an echo).
func holdConnection(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil {
		t.Fatal(err)
	}
	return c
}

// A draining Envoy with an open connection keeps running until the connection
// closes; then the drain ends at zero.
func TestDrainWaitsForActiveConnections(t *testing.T) {
	dir := testkit.ShortDir(t)
	in := testkit.FreeAddr(t)
	p, s, _ := startReady(t, "-bootstrap-template", inboundTemplate(t, dir, in), "-exit-on-zero-active-connections",
		"-minimum-drain-duration", "0s", "-drain-poll-interval", "20ms")
	c := holdConnection(t, in)
	admin := envoy.Admin{Addr: s.cfg.Envoy.AdminAddr}
	testkit.Eventually(t, "one active connection", func() bool {
		n, err := admin.ActiveConnections(t.Context())
		return err == nil && n == 1
	})
	s.cancel()
	event[events.EnvoyDraining](t, p)
	// The drain closed the inbound listener to new connections ...
	testkit.Eventually(t, "inbound listener drained", func() bool {
		c2, err := net.Dial("tcp", in)
		if err == nil {
			c2.Close()
		}
		return err != nil
	})
	// ... and the one open connection keeps Envoy up: still answering.
	if n, err := admin.ActiveConnections(t.Context()); err != nil || n != 1 {
		t.Fatalf("active connections while draining: %d, %v", n, err)
	}
	if has[events.EnvoyExited](p) {
		t.Fatal("envoy stopped with a connection open")
	}
	c.Close()
	if err := s.wait(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	x := event[events.EnvoyExited](t, p)
	if x.Drain != events.DrainZeroReached || x.ActiveConnections != 0 {
		t.Fatalf("exited %+v", x)
	}
}

// A connection that never closes meets the hard deadline: Envoy is killed.
func TestDrainHardDeadlineKillsEnvoy(t *testing.T) {
	dir := testkit.ShortDir(t)
	in := testkit.FreeAddr(t)
	p, s, _ := startReady(t, "-bootstrap-template", inboundTemplate(t, dir, in), "-exit-on-zero-active-connections",
		"-minimum-drain-duration", "0s", "-drain-poll-interval", "20ms", "-drain-deadline", "500ms")
	holdConnection(t, in)
	s.cancel()
	if err := s.wait(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	x := event[events.EnvoyExited](t, p)
	if x.Drain != events.DrainDeadline || x.Signal != "killed" || x.ActiveConnections != 1 {
		t.Fatalf("exited %+v", x)
	}
}

// Without EXIT_ON_ZERO_ACTIVE_CONNECTIONS the drain lasts TERMINATION_DRAIN_DURATION,
// connections or not, then Envoy is stopped.
func TestDrainForTerminationDrainDuration(t *testing.T) {
	dir := testkit.ShortDir(t)
	in := testkit.FreeAddr(t)
	p, s, _ := startReady(t, "-bootstrap-template", inboundTemplate(t, dir, in), "-drain-time", "100ms")
	holdConnection(t, in)
	s.cancel()
	if err := s.wait(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if d := event[events.EnvoyDraining](t, p); d.Strategy != events.DrainDuration {
		t.Fatalf("draining %+v", d)
	}
	x := event[events.EnvoyExited](t, p)
	if x.Drain != events.DrainElapsed || x.Code != 0 || x.Signal != "" || x.Crashed {
		t.Fatalf("exited %+v", x)
	}
}

// Envoy crashing takes the launcher down with Envoy's status, and says so. (The
// stand-in is a Go program, whose runtime turns SIGSEGV into exit code 2: the
// crash here is a SIGKILL, as the kernel's OOM killer ends an Envoy.)
func TestEnvoyCrashEndsTheLauncherWithItsStatus(t *testing.T) {
	p, s, st := startReady(t)
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := s.wait(t)
	var exit *lifecycle.ExitError
	if !errors.As(err, &exit) || exit.Code != 128+int(syscall.SIGKILL) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Run = %v", err)
	}
	x := event[events.EnvoyExited](t, p)
	if !x.Crashed || x.Signal != "killed" || x.Code != -1 || x.Drain != events.DrainNone {
		t.Fatalf("exited %+v", x)
	}
	if has[events.EnvoyDraining](p) {
		t.Fatal("a crash is no drain")
	}
}

// /quitquitquit on the status port stops Envoy at once and ends the launcher
// cleanly (exit code 0).
func TestQuitQuitQuit(t *testing.T) {
	p, s, _ := startReady(t, "-drain-time", "1h")
	resp, err := http.Post("http://"+s.l.StatusAddr()+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	err = s.wait(t)
	var exit *lifecycle.ExitError
	if !errors.As(err, &exit) || exit.Code != 0 {
		t.Fatalf("Run = %v", err)
	}
	if x := event[events.EnvoyExited](t, p); x.Crashed || x.Code != 0 || x.Drain != events.DrainQuit {
		t.Fatalf("exited %+v", x)
	}
}

// /drain drains Envoy's listeners and makes the pod not ready, without stopping it.
func TestStatusDrainMakesThePodNotReady(t *testing.T) {
	_, s, _ := startReady(t)
	base := "http://" + s.l.StatusAddr()
	testkit.Eventually(t, "ready", func() bool { code, _ := testkit.HTTPGet(base + "/healthz/ready"); return code == 200 })
	resp, err := http.Post(base+"/drain", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/drain %d", resp.StatusCode)
	}
	if code, body := testkit.HTTPGet(base + "/healthz/ready"); code != 503 || !strings.Contains(body, "draining") {
		t.Fatalf("ready after /drain: %d %s", code, body)
	}
	// Envoy's stats are merged into the status port's /stats/prometheus.
	if code, body := testkit.HTTPGet(base + "/stats/prometheus"); code != 200 || !strings.Contains(body, "envoy_server_live") ||
		!strings.Contains(body, "meshagent_launcher_envoy_up 1") {
		t.Fatalf("/stats/prometheus %d:\n%s", code, body)
	}
}

// A web page open on the host posts a form to /drain and /quitquitquit (the
// attack of issue 22): Envoy keeps running, undrained, and the pod stays ready.
func TestCrossOriginFormPostLeavesEnvoyRunning(t *testing.T) {
	p, s, st := startReady(t)
	base := "http://" + s.l.StatusAddr()
	testkit.Eventually(t, "ready", func() bool { code, _ := testkit.HTTPGet(base + "/healthz/ready"); return code == 200 })
	for _, path := range []string{"/drain", "/quitquitquit"} {
		// What a browser sends for <form method=post action=http://127.0.0.1:15020/drain>.
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader("x=1"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "https://evil.example")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Sec-Fetch-Mode", "navigate")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST %s from a page: %d", path, resp.StatusCode)
		}
	}
	// State: the same Envoy process lives, the launcher runs, the pod is ready, and
	// nothing was drained.
	if err := syscall.Kill(st.PID, 0); err != nil {
		t.Fatalf("envoy %d: %v", st.PID, err)
	}
	select {
	case err := <-s.done:
		s.done <- err
		t.Fatalf("launcher stopped: %v", err)
	default:
	}
	if code, body := testkit.HTTPGet(base + "/healthz/ready"); code != 200 {
		t.Fatalf("not ready after refused posts: %d %s", code, body)
	}
	if has[events.EnvoyDraining](p) || has[events.EnvoyExited](p) {
		t.Fatal("envoy drained or exited")
	}
	if !strings.Contains(p.log.String(), "status request refused") {
		t.Error("no log line for the refusal")
	}
	// The same endpoint still drains for the pod's own hook (curl -X POST).
	resp, err := http.Post(base+"/drain", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, _ := testkit.HTTPGet(base + "/healthz/ready"); resp.StatusCode != 200 || code != 503 {
		t.Fatalf("hook drain %d, ready %d", resp.StatusCode, code)
	}
}

// With -envoy-uid/-envoy-gid Envoy runs as that user, as Istio runs it as 1337.
func TestEnvoyRunsAsTheGivenUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	p := newPod(t)
	p.relayReady.Store(true)
	p.giveSecrets()
	// uid 1337 must be able to run the binary and read the bootstrap.
	bin := filepath.Join(p.dir, "envoy")
	exe, _ := os.Executable()
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.start(p.args("-envoy-binary", bin, "-envoy-uid", "1337", "-envoy-gid", "1337")...)
	st := event[events.EnvoyStarted](t, p)
	status, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nUid:\t1337\t") || !strings.Contains(string(status), "\nGid:\t1337\t") {
		t.Fatalf("envoy's /proc status:\n%s", status)
	}
}

// Once Envoy runs, the launcher keeps watching the pod's parts: when sds-edge
// stops serving its certificate (crashed, restarted, frozen) the pod turns not
// ready within a watch interval, naming what is missing, and a pod.parts event
// says so; when it serves again, readiness returns and so does a healthy
// pod.parts. Envoy is left running throughout.
func TestLauncherWatchesThePodsPartsAfterStart(t *testing.T) {
	p := newPod(t)
	p.relayReady.Store(true)
	p.giveSecrets()
	s := p.start(p.args("-watch-every", "50ms")...)
	started := event[events.EnvoyStarted](t, p)
	status := func() (int, string) {
		if s.l.StatusAddr() == "" {
			return 0, ""
		}
		return testkit.HTTPGet("http://" + s.l.StatusAddr() + "/healthz/ready")
	}
	testkit.Eventually(t, "ready", func() bool { code, _ := status(); return code == http.StatusOK })
	if has[events.PodParts](p) {
		t.Fatal("pod.parts published while every part served")
	}

	p.sdsHeld.Store(false) // sds-edge restarted and holds nothing yet
	down := event[events.PodParts](t, p)
	if down.Healthy || len(down.Missing) == 0 || !strings.Contains(strings.Join(down.Missing, " "), "certificate default") {
		t.Fatalf("pod.parts %+v: want unhealthy, naming the certificate", down)
	}
	testkit.Eventually(t, "not ready, naming sds-edge's certificate", func() bool {
		code, body := status()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "certificate default")
	})
	if !strings.Contains(p.log.String(), "a part of the pod stopped serving") {
		t.Error("no WARN line about the part that stopped")
	}

	p.sdsHeld.Store(true)
	testkit.Eventually(t, "a healthy pod.parts and ready again", func() bool {
		p.mu.Lock()
		healthy := false
		for _, e := range p.seen {
			if pp, ok := e.(events.PodParts); ok && pp.Healthy {
				healthy = true
			}
		}
		p.mu.Unlock()
		code, _ := status()
		return healthy && code == http.StatusOK
	})
	if has[events.EnvoyExited](p) {
		t.Fatalf("envoy (pid %d) exited while a part was down", started.PID)
	}
}
