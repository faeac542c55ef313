package sdsedge_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/sdsedge"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// failing makes the CA answer every sign request with "unavailable" until back.
func (c *testCA) failing() { c.failNext.Store(1 << 30) }
func (c *testCA) back()    { c.failNext.Store(0) }

// TestRetryNowWhenEnvoyAsksOrTheBusIsBack: with the CA back, a fresh SDS request
// for `default`, or the bus reconnecting, ends a long retry wait at once (after
// RetryMin), instead of the pod's backoff deciding when `default` is served again.
func TestRetryNowWhenEnvoyAsksOrTheBusIsBack(t *testing.T) {
	tests := []struct {
		name  string
		retry func(t *testing.T, p *pod, cc *grpc.ClientConn)
	}{
		{"envoy asks again", func(t *testing.T, p *pod, cc *grpc.ClientConn) { p.open(t, cc, "default") }},
		{"bus reconnects", func(t *testing.T, p *pod, _ *grpc.ClientConn) {
			if err := p.nc.ForceReconnect(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			clk := clock.NewFake(time.Now())
			p := v.startPod(podOpt{clock: clk, args: []string{"-retry-min", "100ms", "-retry-max", "10m"}})
			cc := p.dial(t)
			st := p.open(t, cc, "default")
			first := leafOf(t, recv(t, st).Secrets["default"])

			v.ca.failing()
			renew(t, v.nc, pki.SerialHex(first))
			// Seven failures: the backoff is 6.4 s now. A wait has a timer, besides
			// the expiry watch's.
			for i := range 6 {
				testkit.Eventually(t, "failed attempt and its wait", func() bool { return v.ca.requests.Load() == int32(2+i) && clk.Timers() == 2 })
				clk.Add(100 * time.Millisecond << i)
			}
			testkit.Eventually(t, "seventh failure and its wait", func() bool { return v.ca.requests.Load() == 8 && clk.Timers() == 2 })

			v.ca.back()
			tc.retry(t, p, cc)
			clk.Add(100 * time.Millisecond)
			next := leafOf(t, recv(t, st).Secrets["default"])
			if next.SerialNumber.Cmp(first.SerialNumber) == 0 {
				t.Fatal("the same certificate pushed again")
			}
			if got := v.ca.requests.Load(); got != 9 {
				t.Fatalf("%d sign requests, want 9 (the prompted retry is the last)", got)
			}
		})
	}
}

// TestExpiringAndExpiredCertificateIsNotReady: a certificate with less than a
// tenth of its life left whose renewal keeps failing makes the pod not ready and
// publishes cert.expiring; at NotAfter, to the instant, readiness says expired,
// the metric says so and cert.expiring (expired) is published; the certificate
// is still served; a renewal makes the pod ready again.
func TestExpiringAndExpiredCertificateIsNotReady(t *testing.T) {
	v := newEnv(t)
	clk := clock.NewFake(time.Now())
	evs := bustest.Record(t, v.nc, events.PodEventWildcard(events.PodEventCertExpiring))
	p := v.startPod(podOpt{clock: clk, args: []string{"-secret-ttl", "1h"}})
	cc := p.dial(t)
	st := p.open(t, cc, "default")
	first := leafOf(t, recv(t, st).Secrets["default"])
	testkit.Eventually(t, "ready", func() bool { return p.e.Ready() == nil })
	serial := pki.SerialHex(first)

	v.ca.failing()
	testkit.Eventually(t, "safety deadline and expiry watch armed", func() bool { return clk.Timers() == 2 })
	clk.Set(first.NotAfter.Add(-5 * time.Minute)) // past the safety deadline, 5 of 60 minutes left
	testkit.Eventually(t, "not ready: expiring", func() bool {
		err := p.e.Ready()
		return err != nil && strings.Contains(err.Error(), "renewal is failing")
	})
	testkit.Eventually(t, "cert.expiring (expiring) published", func() bool {
		return len(bustest.Find(evs, func(e events.CertExpiring) bool { return e.State == events.CertStateExpiring && e.Serial == serial })) == 1
	})
	if p.metric(t, "meshagent_sds_edge_serving_expired") != 0 {
		t.Fatal("serving_expired before expiry")
	}
	// Failing with minutes left is not urgent: the bus reconnects on its usual schedule.
	if bus.Urgent() {
		t.Fatal("bus reconnects urgent with 5 of 60 minutes left")
	}

	clk.Set(first.NotAfter.Add(-time.Millisecond))
	if err := p.e.Ready(); err == nil || strings.Contains(err.Error(), "expired") {
		t.Fatalf("a millisecond before expiry: %v", err)
	}
	clk.Set(first.NotAfter)
	if err := p.e.Ready(); err == nil || !strings.Contains(err.Error(), "serving an expired certificate") {
		t.Fatalf("at expiry readiness says %v", err)
	}
	if p.metric(t, "meshagent_sds_edge_serving_expired") != 1 {
		t.Fatal("serving_expired not 1 at expiry")
	}
	// Failing at expiry is: the pod's bus reconnects come within a second.
	testkit.Eventually(t, "bus reconnects urgent once expired", func() bool {
		clk.Add(100 * time.Millisecond) // the retry wait, for the next failed attempt
		return bus.Urgent()
	})
	testkit.Eventually(t, "cert.expiring (expired) published", func() bool {
		return len(bustest.Find(evs, func(e events.CertExpiring) bool {
			return e.State == events.CertStateExpired && e.Serial == serial && e.Failures > 0 && e.LastError != ""
		})) == 1
	})
	if got := p.serial(t, cc); got != serial {
		t.Fatalf("serving %s, want the expired %s still served", got, serial)
	}

	// The test CA signs on the wall clock: bring the pod's clock back to it, so
	// that the new certificate is valid for the pod (still failing: nothing changes).
	clk.Set(time.Now())
	v.ca.back()
	p.open(t, cc, "default") // Envoy asks again
	// The wake-up ends the retry wait after what is left of RetryMin on the pod's
	// clock; an attempt in flight meanwhile (it fails) waits again and is woken
	// again: step the clock until the new certificate comes.
	next := leafOf(t, recvStepping(t, st, clk, 100*time.Millisecond).Secrets["default"])
	if pki.SerialHex(next) == serial {
		t.Fatal("the expired certificate pushed again")
	}
	testkit.Eventually(t, "ready after renewal", func() bool { return p.e.Ready() == nil })
	if bus.Urgent() {
		t.Fatal("bus reconnects still urgent after the renewal")
	}
	if p.metric(t, "meshagent_sds_edge_serving_expired") != 0 {
		t.Fatal("serving_expired after renewal")
	}
	if n := len(bustest.Find(evs, func(e events.CertExpiring) bool { return true })); n != 2 {
		t.Fatalf("%d cert.expiring events, want 2 (one per state)", n)
	}
}

// TestFallsBackToGRPCWhenBusIsGone: with -ca-fallback-addr, a pod signs on the
// bus while it can and over the CA's gRPC API once the bus is gone.
func TestFallsBackToGRPCWhenBusIsGone(t *testing.T) {
	v := newEnv(t)
	addr := v.ca.serveGRPC(t)
	clk := clock.NewFake(time.Now())
	p := v.startPod(podOpt{clock: clk, args: []string{"-ca-fallback-addr", addr, "-secret-ttl", "1h"}})
	st := p.open(t, p.dial(t), "default")
	first := leafOf(t, recv(t, st).Secrets["default"])
	if v.ca.lastReq.Load() == nil || v.ca.lastMD.Load() != nil {
		t.Fatal("the first certificate did not come over the bus")
	}

	v.ns.Shutdown()
	v.ns.WaitForShutdown()
	testkit.Eventually(t, "pod sees the bus gone", func() bool { return !p.nc.IsConnected() })
	testkit.Eventually(t, "safety deadline and expiry watch armed", func() bool { return clk.Timers() == 2 })
	clk.Add(49 * time.Minute) // past the safety deadline
	next := leafOf(t, recv(t, st).Secrets["default"])
	if next.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the same certificate pushed again")
	}
	if v.ca.lastMD.Load() == nil {
		t.Fatal("renewed, but not over gRPC")
	}
}

// TestStartsAndServesWithoutBus: with -ca-addr and no bus reachable, sds-edge
// (the whole process: lifecycle.Serve) binds its socket, serves `default` and is
// ready, instead of waiting for the bus and exiting.
func TestStartsAndServesWithoutBus(t *testing.T) {
	ca := newTestCA(t)
	addr := ca.serveGRPC(t)
	root := testkit.ShortDir(t)
	writeToken(t, root, ca.token("default", "web", time.Hour))
	rootFile := filepath.Join(root, "ca-root.pem")
	if err := os.WriteFile(rootFile, []byte(ca.bundle()[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	httpAddr := testkit.FreeAddr(t)
	args := []string{"-pod", testPod, "-pod-root", root, "-nats-url", "nats://" + testkit.FreeAddr(t), "-nats-connect-wait", "1s",
		"-namespace", "default", "-service-account", "web", "-socket", "sds.sock", "-http-addr", httpAddr,
		"-ca-addr", addr, "-ca-root-cert", rootFile, "-log-level", "error"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lifecycle.Serve(ctx, args, func(string) string { return "" }, sdsedge.Load, sdsedge.New)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	sock := filepath.Join(root, "sds.sock")
	testkit.Eventually(t, "sds socket", func() bool { _, err := os.Stat(sock); return err == nil })
	cc, err := sdsclient.DialUnix(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	got, err := sdsclient.Fetch(context.Background(), cc, "n", "default")
	if err != nil {
		t.Fatal(err)
	}
	if id := leafOf(t, got["default"]).URIs[0].String(); id != "spiffe://cluster.local/ns/default/sa/web" {
		t.Fatalf("identity %s", id)
	}
	testkit.Eventually(t, "/readyz 200 without a bus", func() bool {
		code, _ := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == 200
	})
}

// TestFallsBackThroughTheGRPCListWhenTheBusDoesNotAnswer: on a connected bus whose
// signer holds requests without answering (frozen), and with a first fallback CA
// that accepts connections and never answers (frozen too), a pod gets its
// certificate from the next CA of -ca-fallback-addr within one attempt.
func TestFallsBackThroughTheGRPCListWhenTheBusDoesNotAnswer(t *testing.T) {
	v := newEnv(t)
	addr := v.ca.serveGRPC(t)
	v.ca.silent.Store(true)
	frozen, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := frozen.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = frozen.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	rootFile := filepath.Join(t.TempDir(), "ca-root.pem")
	if err := os.WriteFile(rootFile, []byte(v.ca.bundle()[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	p := v.startPod(podOpt{args: []string{"-ca-fallback-addr", frozen.Addr().String() + "," + addr, "-ca-root-cert", rootFile,
		"-ca-timeout", "6s", "-secret-ttl", "1h"}})
	st := p.open(t, p.dial(t), "default")
	leafOf(t, recv(t, st).Secrets["default"])
	if v.ca.lastMD.Load() == nil {
		t.Fatal("the certificate did not come over gRPC")
	}
	mu.Lock()
	tried := len(held)
	mu.Unlock()
	if tried == 0 {
		t.Fatal("the frozen first CA was never tried")
	}
	if n := p.metric(t, "meshagent_sds_edge_csr_failed_total"); n != 0 {
		t.Fatalf("%v failed attempts: the first attempt should have gone through to the second CA", n)
	}
	t.Logf("certificate over the second gRPC CA %s after the start", time.Since(began).Round(time.Millisecond))
}

// TestReconnectRenewsWhenTheRenewDueWasMissed: the rotator publishes a renew-due
// once; a pod off the bus at that moment (frozen, cut off) misses it. When the
// bus comes back past the renew-due point (SECRET_GRACE_PERIOD_RATIO of the life
// left), the pod renews within 3 s (docs/reliability.md) instead of at its
// safety deadline; before that point a reconnect renews nothing.
func TestReconnectRenewsWhenTheRenewDueWasMissed(t *testing.T) {
	v := newEnv(t)
	clk := clock.NewFake(time.Now())
	p := v.startPod(podOpt{clock: clk, args: []string{"-secret-ttl", "1h"}})
	st := p.open(t, p.dial(t), "default")
	first := leafOf(t, recv(t, st).Secrets["default"])
	life := first.NotAfter.Sub(first.NotBefore)
	testkit.Eventually(t, "safety deadline armed", func() bool { return clk.Timers() >= 1 })
	asked := v.ca.requests.Load()

	clk.Set(first.NotBefore.Add(life * 3 / 10)) // before the renew-due
	if err := p.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "reconnected", func() bool { return p.nc.IsConnected() && p.nc.Stats().Reconnects >= 1 })
	time.Sleep(300 * time.Millisecond)
	if got := v.ca.requests.Load(); got != asked {
		t.Fatalf("a reconnect before the renew-due point sent %d sign requests", got-asked)
	}

	clk.Set(first.NotBefore.Add(life * 6 / 10)) // the renew-due (half the life left) passed unseen
	start := time.Now()
	if err := p.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	next := leafOf(t, recv(t, st).Secrets["default"])
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("renewed %s after reconnecting, want within 3 s", took)
	}
	if next.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the same certificate pushed again")
	}
}
