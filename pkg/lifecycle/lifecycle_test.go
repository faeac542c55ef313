package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// toyConfig is a service config as every service has one: its own knobs plus
// what the lifecycle reads.
type toyConfig struct {
	Log   obs.LogConfig
	Bus   bus.Config
	NoBus bool
	HTTP  string
	Fail  string
}

func (c toyConfig) Process() Process {
	p := Process{Name: "toy", Log: c.Log, HTTP: c.HTTP, LogWith: []any{"pod", "p1"}}
	if !c.NoBus {
		p.Bus = &c.Bus
	}
	return p
}

func loadToy(args []string, getenv func(string) string) (toyConfig, error) {
	var c toyConfig
	fs := flagenv.New("toy", getenv)
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	fs.String(&c.HTTP, "http-addr", "HTTP_ADDR", "127.0.0.1:0", "health and metrics listen address")
	fs.Bool(&c.NoBus, "no-bus", "TOY_NO_BUS", false, "run without a bus")
	fs.String(&c.Fail, "fail", "TOY_FAIL", "", "make Run fail with this error")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	return c, errors.Join(c.Log.Validate(), c.Bus.Validate())
}

// toy records what it was given and runs until cancelled (or fails when told).
type toy struct {
	cfg   toyConfig
	deps  Deps
	ran   atomic.Bool
	ready atomic.Bool
}

func newToy(cfg toyConfig, d Deps) (*toy, error) {
	t := &toy{cfg: cfg, deps: d}
	d.Health.AddReadyCheck("toy", func() error {
		if !t.ready.Load() {
			return errors.New("not yet")
		}
		return nil
	})
	return t, nil
}

func (t *toy) Run(ctx context.Context) error {
	t.ran.Store(true)
	if t.cfg.Fail != "" {
		return errors.New(t.cfg.Fail)
	}
	t.ready.Store(true)
	<-ctx.Done()
	return ctx.Err() // what many a loop returns; the lifecycle takes it as a clean stop
}

type served struct {
	err  chan error
	svc  atomic.Pointer[toy]
	http atomic.Pointer[obs.Server]
	logs *testkit.Buffer
}

func start(t *testing.T, ctx context.Context, args ...string) *served {
	t.Helper()
	s := &served{err: make(chan error, 1), logs: &testkit.Buffer{}}
	build := func(cfg toyConfig, d Deps) (*toy, error) {
		v, err := newToy(cfg, d)
		s.svc.Store(v)
		return v, err
	}
	go func() {
		s.err <- serve(ctx, args, func(string) string { return "" }, loadToy, build, s.logs, func(h *obs.Server) { s.http.Store(h) }, nil)
	}()
	return s
}

func TestServeRunsServiceBesideHealthServerAndStopsCleanly(t *testing.T) {
	ns := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := start(t, ctx, "-nats-url", ns.ClientURL())
	testkit.Eventually(t, "the health server", func() bool { h := s.http.Load(); return h != nil && h.Addr() != nil })
	url := "http://" + s.http.Load().Addr().String()
	testkit.Eventually(t, "/readyz 200 once the service says so", func() bool {
		code, _ := testkit.HTTPGet(url + "/readyz")
		return code == 200
	})
	svc := s.svc.Load()
	if svc.deps.Bus == nil || !svc.deps.Bus.IsConnected() {
		t.Fatal("Deps.Bus is not a live connection")
	}
	if svc.deps.Clock == nil || svc.deps.Log == nil || svc.deps.Metrics == nil {
		t.Fatalf("Deps incomplete: %+v", svc.deps)
	}
	if code, body := testkit.HTTPGet(url + "/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics: %d", code)
	}
	cancel()
	if err := <-s.err; err != nil {
		t.Fatalf("cancelled Serve returned %v, want nil", err)
	}
	if !svc.deps.Bus.IsClosed() {
		t.Fatal("bus connection left open after Serve returned")
	}
	if !strings.Contains(s.logs.String(), "pod=p1") {
		t.Fatalf("LogWith not on the log lines:\n%s", s.logs.String())
	}
}

func TestServeWithoutBus(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := start(t, ctx, "-no-bus")
	testkit.Eventually(t, "the service running", func() bool { v := s.svc.Load(); return v != nil && v.ran.Load() })
	if s.svc.Load().deps.Bus != nil {
		t.Fatal("a service without a bus got a connection")
	}
	cancel()
	if err := <-s.err; err != nil {
		t.Fatal(err)
	}
}

func TestCancelWhileWaitingForBusIsACleanStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := start(t, ctx, "-nats-url", "nats://127.0.0.1:1", "-nats-connect-wait", "1h", "-log-level", "debug")
	testkit.Eventually(t, "Serve retrying the bus", func() bool { return strings.Contains(s.logs.String(), "nats not reachable yet") })
	cancel()
	select {
	case err := <-s.err:
		if err != nil {
			t.Fatalf("Ctrl-C during connect: %v, want nil", err)
		}
	case <-time.After(testkit.Timeout):
		t.Fatal("Serve kept waiting for the bus after cancel")
	}
	if s.svc.Load() != nil {
		t.Fatal("the service was built without a bus")
	}
}

// A process the bus does not admit yet (the bus not up, its auth callout down)
// serves its health endpoints meanwhile — /healthz ok, /readyz 503 saying what it
// waits for — logs that at the default level, and keeps waiting (no connect
// deadline by default) until the bus comes, then builds and runs the service.
func TestHealthAnswersWhileWaitingForTheBus(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	httpAddr, natsAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	s := start(t, ctx, "-nats-url", "nats://"+natsAddr, "-http-addr", httpAddr)
	url := "http://" + httpAddr
	testkit.Eventually(t, "/readyz 503 naming the bus while it is awaited", func() bool {
		code, body := testkit.HTTPGet(url + "/readyz")
		return code == 503 && strings.Contains(body, "waiting for the bus at nats://"+natsAddr)
	})
	if code, _ := testkit.HTTPGet(url + "/healthz"); code != 200 {
		t.Fatalf("/healthz %d while waiting for the bus: the process is alive", code)
	}
	testkit.Eventually(t, "an INFO line saying what it waits for", func() bool {
		return strings.Contains(s.logs.String(), "[INFO]  toy.bus: waiting for the bus")
	})
	if s.svc.Load() != nil {
		t.Fatal("the service was built without a bus")
	}
	host, port := splitHostPort(t, natsAddr)
	ns, err := embedded.Start(embedded.Config{Host: host, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	testkit.Eventually(t, "/readyz 200 once the bus came and the service runs", func() bool {
		code, _ := testkit.HTTPGet(url + "/readyz")
		return code == 200
	})
	cancel()
	if err := <-s.err; err != nil {
		t.Fatal(err)
	}
}

func splitHostPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

func TestBusThatNeverComesIsAnError(t *testing.T) {
	s := start(t, context.Background(), "-nats-url", "nats://127.0.0.1:1", "-nats-connect-wait", "100ms")
	err := <-s.err
	if err == nil || !strings.Contains(err.Error(), "connect to nats") {
		t.Fatalf("got %v, want a connect error", err)
	}
}

func TestServiceFailureStopsTheProcessWithItsError(t *testing.T) {
	ns := bustest.Server(t)
	s := start(t, context.Background(), "-nats-url", ns.ClientURL(), "-fail", "boom")
	if err := <-s.err; err == nil || err.Error() != "boom" {
		t.Fatalf("got %v, want boom", err)
	}
}

func TestBadConfigBuildsNothing(t *testing.T) {
	s := start(t, context.Background(), "-nats-connect-wait", "-1s", "-log-level", "loud")
	err := <-s.err
	if err == nil || !strings.Contains(err.Error(), "-nats-connect-wait") || !strings.Contains(err.Error(), "-log-level") {
		t.Fatalf("got %v, want both problems named", err)
	}
	if s.svc.Load() != nil {
		t.Fatal("built a service from a bad config")
	}
}

func TestExitCode(t *testing.T) {
	_, helpErr := loadToy([]string{"-h"}, func(string) string { return "" })
	for _, tc := range []struct {
		name      string
		err       error
		code      int
		out, errw string
	}{
		{"clean", nil, 0, "", ""},
		{"help lists every flag with its env var", helpErr, 0, "NATS_CONNECT_WAIT", ""},
		{"failure", errors.New("listen: busy"), 1, "", "toy: listen: busy\n"},
		{"a child's exit code", fmt.Errorf("run: %w", &ExitError{Code: 139, Reason: "envoy crashed"}), 139, "", "toy: run: envoy crashed\n"},
		{"asked to stop", &ExitError{Code: 0, Reason: "quitquitquit"}, 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errw bytes.Buffer
			if got := exitCode("toy", tc.err, &out, &errw); got != tc.code {
				t.Fatalf("exit code %d, want %d", got, tc.code)
			}
			if !strings.Contains(out.String(), tc.out) || (tc.errw != "" && errw.String() != tc.errw) || (tc.errw == "" && errw.Len() != 0) {
				t.Fatalf("stdout %q stderr %q", out.String(), errw.String())
			}
		})
	}
}

func TestTasks(t *testing.T) {
	boom := errors.New("boom")
	block := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	t.Run("first failure cancels the rest and is returned", func(t *testing.T) {
		var stopped atomic.Int32
		err := Tasks(context.Background(),
			func(ctx context.Context) error { <-ctx.Done(); stopped.Add(1); return errors.New("later, from cancel") },
			func(context.Context) error { return boom },
			func(ctx context.Context) error { <-ctx.Done(); stopped.Add(1); return nil })
		if !errors.Is(err, boom) || stopped.Load() != 2 {
			t.Fatalf("err %v, stopped %d", err, stopped.Load())
		}
	})
	t.Run("cancellation is nil", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Tasks(ctx, block, block) }()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a task that ends early ends only itself", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var other atomic.Bool
		done := make(chan error, 1)
		go func() {
			done <- Tasks(ctx, func(context.Context) error { return nil },
				func(ctx context.Context) error { other.Store(true); <-ctx.Done(); return nil })
		}()
		testkit.Eventually(t, "the other task running", other.Load)
		select {
		case err := <-done:
			t.Fatalf("Tasks returned %v while a task still ran", err)
		default:
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a panicking task is that task's error and the others are shut down", func(t *testing.T) {
		var stopped atomic.Bool
		err := Tasks(context.Background(),
			func(ctx context.Context) error { <-ctx.Done(); stopped.Store(true); return nil },
			func(context.Context) error { panic("broken invariant") })
		var pe *PanicError
		if !errors.As(err, &pe) || pe.Value != "broken invariant" || !strings.Contains(string(pe.Stack), "lifecycle_test.go") {
			t.Fatalf("err %v: want a *PanicError with the value and the panicking stack", err)
		}
		if !stopped.Load() {
			t.Fatal("the other task was not cancelled and waited for")
		}
	})
	t.Run("context.Canceled from a task whose own work failed still counts as failure", func(t *testing.T) {
		err := Tasks(context.Background(), func(context.Context) error { return context.Canceled })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v: a task's own Canceled with ctx alive must not be swallowed", err)
		}
	})
}

func TestWithDefaultsFillsOnlyWhatIsMissing(t *testing.T) {
	ns := bustest.Server(t)
	nc := bustest.Conn(t, ns)
	d := Deps{Bus: nc}.WithDefaults()
	if d.Bus != nc || d.Clock == nil || d.Log == nil || d.Metrics == nil || d.Health == nil {
		t.Fatalf("%+v", d)
	}
	reg := d.Metrics
	if again := d.WithDefaults(); again.Metrics != reg {
		t.Fatal("WithDefaults replaced a registry it was given")
	}
}
