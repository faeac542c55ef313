package workloadhealth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv/istioenv"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSettingsFillIstiosDefaults: unset numbers take Istio's defaults
// (fillInDefaults), the initial delay stays zero.
func TestSettingsFillIstiosDefaults(t *testing.T) {
	got := SettingsOf(istioenv.ReadinessProbe{})
	want := Settings{Timeout: time.Second, Period: 10 * time.Second, SuccessThreshold: 1, FailureThreshold: 1}
	if got != want {
		t.Fatalf("defaults %+v, want %+v", got, want)
	}
	got = SettingsOf(istioenv.ReadinessProbe{InitialDelaySeconds: 3, TimeoutSeconds: 2, PeriodSeconds: 5, SuccessThreshold: 2, FailureThreshold: 4})
	want = Settings{InitialDelay: 3 * time.Second, Timeout: 2 * time.Second, Period: 5 * time.Second, SuccessThreshold: 2, FailureThreshold: 4}
	if got != want {
		t.Fatalf("given %+v, want %+v", got, want)
	}
}

type report struct {
	healthy bool
	msg     string
}

// TestRunReportsChangesAtTheThresholds: with a success threshold of 2 and a
// failure threshold of 3, a scripted app's results give the reports Istio's
// agent sends (PerformApplicationHealthCheck): the first when a threshold is
// first reached, then one per change, none while the health holds, and a
// broken run of results counts from zero. Probes run after the initial delay,
// then one per period of the (fake) clock.
func TestRunReportsChangesAtTheThresholds(t *testing.T) {
	const ok, bad = true, false
	script := []bool{bad, bad, bad, ok, ok, ok, ok, bad, bad, ok, bad, bad, bad, bad, ok}
	want := []report{
		{false, "app down 3"},  // third failure in a row
		{true, ""},             // second success in a row
		{false, "app down 13"}, // the failures at 8-9 were broken by a success at 10
		// the success at 15 is one of two
	}
	set := Settings{InitialDelay: 7 * time.Second, Timeout: time.Second, Period: 5 * time.Second, SuccessThreshold: 2, FailureThreshold: 3}
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var mu sync.Mutex
	calls := 0
	var got []report
	probe := func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a probe without a deadline")
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		if script[calls-1] {
			return nil
		}
		return fmt.Errorf("app down %d", calls)
	}
	c := NewWithProber(set, probe, clk, func(healthy bool, msg string) {
		mu.Lock()
		got = append(got, report{healthy, msg})
		mu.Unlock()
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	count := func() int { mu.Lock(); defer mu.Unlock(); return calls }
	for i := range script {
		testkit.Eventually(t, "probe "+strconv.Itoa(i)+" scheduled", func() bool { return clk.Timers() == 1 && count() == i })
		step := set.Period
		if i == 0 {
			clk.Add(set.InitialDelay - time.Second)
			if count() != 0 {
				t.Fatal("probed before the initial delay")
			}
			step = time.Second
		}
		clk.Add(step)
	}
	testkit.Eventually(t, "every probe run", func() bool { return count() == len(script) && clk.Timers() == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("reports %v, want %v", got, want)
	}
}

// TestProbeMethods: each method against a real app, healthy and not, with the
// messages the control plane is told.
func TestProbeMethods(t *testing.T) {
	ready := true
	var mu sync.Mutex
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/ready" || r.Header.Get("X-Probe") != "yes" || r.Host != "web.local" || r.UserAgent() != UserAgent {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		if !ready {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
		}
	}))
	defer app.Close()
	host, port := hostPort(t, app.Listener.Addr())

	gs := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(gln) }()
	defer gs.Stop()
	_, gport := hostPort(t, gln.Addr())
	hs.SetServingStatus("web", healthpb.HealthCheckResponse_SERVING)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort := hostPort(t, closed.Addr())
	closed.Close()

	httpProbe := istioenv.ReadinessProbe{HTTPGet: &istioenv.HTTPGetProbe{Path: "/ready", Port: uint32(port),
		Headers: []istioenv.HTTPHeader{{Name: "X-Probe", Value: "yes"}, {Name: "Host", Value: "web.local"}}}}
	for _, tc := range []struct {
		name    string
		cfg     Config
		before  func()
		wantErr string // "" healthy
	}{
		{"http ready, default host", Config{Probe: httpProbe, Host: host}, nil, ""},
		{"http not ready", Config{Probe: httpProbe, Host: host}, func() { mu.Lock(); ready = false; mu.Unlock() },
			"status code was not from [200,400), bad code 503"},
		{"http refused", Config{Probe: istioenv.ReadinessProbe{HTTPGet: &istioenv.HTTPGetProbe{Port: uint32(closedPort)}}, Host: host}, nil,
			"connection refused"},
		{"tcp open", Config{Probe: istioenv.ReadinessProbe{TCPSocket: &istioenv.TCPSocketProbe{Port: uint32(port)}}, Host: host}, nil, ""},
		{"tcp closed", Config{Probe: istioenv.ReadinessProbe{TCPSocket: &istioenv.TCPSocketProbe{Host: host, Port: uint32(closedPort)}}}, nil,
			"connection refused"},
		{"exec true", Config{Probe: istioenv.ReadinessProbe{Exec: &istioenv.ExecProbe{Command: []string{"true"}}}}, nil, ""},
		{"exec false", Config{Probe: istioenv.ReadinessProbe{Exec: &istioenv.ExecProbe{Command: []string{"sh", "-c", "exit 3"}}}}, nil,
			"exit status 3"},
		{"grpc serving", Config{Probe: istioenv.ReadinessProbe{GRPC: &istioenv.GRPCProbe{Port: uint32(gport), Service: "web"}}, Host: host}, nil, ""},
		{"grpc not serving", Config{Probe: istioenv.ReadinessProbe{GRPC: &istioenv.GRPCProbe{Port: uint32(gport), Service: "web"}}, Host: host},
			func() { hs.SetServingStatus("web", healthpb.HealthCheckResponse_NOT_SERVING) }, "NOT_SERVING"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			p, err := Probe(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = p(ctx)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unhealthy: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("probe: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestEnvoyIsProbedFirst: while Envoy's admin /ready does not answer 200 the
// workload is unhealthy whatever the app says, as Istio's agent probes Envoy first.
func TestEnvoyIsProbedFirst(t *testing.T) {
	var mu sync.Mutex
	live := false
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/ready" && live {
			_, _ = w.Write([]byte("LIVE\n"))
			return
		}
		http.Error(w, "PRE_INITIALIZING", http.StatusServiceUnavailable)
	}))
	defer admin.Close()
	p, err := Probe(Config{Probe: istioenv.ReadinessProbe{Exec: &istioenv.ExecProbe{Command: []string{"true"}}},
		EnvoyAdmin: admin.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := p(context.Background()); err == nil || !strings.Contains(err.Error(), "envoy not ready: admin /ready answered 503") {
		t.Fatalf("envoy initialising: %v", err)
	}
	mu.Lock()
	live = true
	mu.Unlock()
	if err := p(context.Background()); err != nil {
		t.Fatalf("envoy live, app ready: %v", err)
	}
	if _, err := Probe(Config{}); err == nil {
		t.Fatal("a probe with no method was taken")
	}
	if _, err := New(Config{Probe: istioenv.ReadinessProbe{TCPSocket: &istioenv.TCPSocketProbe{Port: 1}}, EnvoyAdmin: "nope"},
		clock.Real{}, func(bool, string) {}, nil); err == nil {
		t.Fatal("a bad envoy admin address was taken")
	}
}

// TestRunEndsWithItsContext: a probe that hangs past its timeout is cut, and
// Run returns nil when its context ends, reporting nothing more.
func TestRunEndsWithItsContext(t *testing.T) {
	started := make(chan struct{}, 1)
	probe := func(ctx context.Context) error {
		started <- struct{}{}
		<-ctx.Done()
		return errors.New("timed out")
	}
	reports := 0
	c := NewWithProber(Settings{Timeout: time.Hour, Period: time.Hour, SuccessThreshold: 1, FailureThreshold: 1}, probe,
		clock.NewFake(time.Unix(0, 0)), func(bool, string) { reports++ }, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	cancel()
	if err := <-done; err != nil || reports != 0 {
		t.Fatalf("Run: %v, %d reports after cancel", err, reports)
	}
}

func hostPort(t *testing.T, a net.Addr) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}
