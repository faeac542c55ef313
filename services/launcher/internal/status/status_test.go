package status

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func serve(t *testing.T, cfg Config) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	if cfg.Ready == nil {
		cfg.Ready = func(context.Context) error { return nil }
	}
	if cfg.EnvoyStats == nil {
		cfg.EnvoyStats = func() string { return "" }
	}
	if cfg.MaxScrape == 0 {
		cfg.MaxScrape = 1 << 20
	}
	s := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-s.Bound()
	return "http://" + s.Addr().String()
}

// An app's HTTP, TCP and gRPC probes, rewritten to the status port as Istio's
// injector does, reach the app and answer with its health.
func TestAppProbersForwardToTheApp(t *testing.T) {
	var appOK atomic.Bool
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" || r.Header.Get("X-Probe") != "yes" || r.Host != "web.local" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		if !appOK.Load() {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(app.Close)
	_, httpPort, _ := net.SplitHostPort(strings.TrimPrefix(app.URL, "http://"))

	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, tcpPort, _ := net.SplitHostPort(tcp.Addr().String())
	closedPort := strings.TrimPrefix(testkit.FreeAddr(t), "127.0.0.1:")

	gs := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(gl)
	t.Cleanup(gs.Stop)
	_, grpcPort, _ := net.SplitHostPort(gl.Addr().String())
	hs.SetServingStatus("web", healthpb.HealthCheckResponse_NOT_SERVING)

	probers, err := ParseProbers(fmt.Sprintf(`{
	  "/app-health/web/readyz": {"httpGet": {"path": "ready", "port": %s, "scheme": "HTTP",
	     "httpHeaders": [{"name": "X-Probe", "value": "yes"}, {"name": "Host", "value": "web.local"}]}, "timeoutSeconds": 2},
	  "/app-health/web/livez": {"tcpSocket": {"port": "%s"}},
	  "/app-health/db/livez": {"tcpSocket": {"port": %s}},
	  "/app-health/web/startupz": {"grpc": {"port": %s, "service": "web"}},
	  "/app-health/nope/startupz": {"grpc": {"port": %s, "service": "nope"}}
	}`, httpPort, tcpPort, closedPort, grpcPort, grpcPort), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	base := serve(t, Config{Probers: probers})
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/app-health/web/readyz", 503}, // the app's own answer
		{"/app-health/web/livez", 200},
		{"/app-health/db/livez", 500},
		{"/app-health/web/startupz", 500},
		{"/app-health/nope/startupz", 500}, // NOT_FOUND, in a trailers-only answer
		{"/app-health/other/livez", 404},
	} {
		if code, body := testkit.HTTPGet(base + tc.path); code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.path, code, body, tc.want)
		}
	}
	appOK.Store(true)
	hs.SetServingStatus("web", healthpb.HealthCheckResponse_SERVING)
	for path, want := range map[string]int{"/app-health/web/readyz": 204, "/app-health/web/startupz": 200, "/app-health/nope/startupz": 500} {
		if code, body := testkit.HTTPGet(base + path); code != want {
			t.Errorf("%s: %d %s, want %d", path, code, body, want)
		}
	}
}

func TestParseProbersRejectsBadInput(t *testing.T) {
	for name, in := range map[string]string{
		"not json":      `{`,
		"bad path":      `{"/healthz": {"tcpSocket": {"port": 1}}}`,
		"no probe":      `{"/app-health/a/livez": {}}`,
		"two probes":    `{"/app-health/a/livez": {"tcpSocket": {"port": 1}, "grpc": {"port": 2}}}`,
		"named port":    `{"/app-health/a/livez": {"tcpSocket": {"port": "http"}}}`,
		"port too big":  `{"/app-health/a/livez": {"httpGet": {"port": 70000}}}`,
		"bad scheme":    `{"/app-health/a/livez": {"httpGet": {"port": 80, "scheme": "FTP"}}}`,
		"bad grpc port": `{"/app-health/a/livez": {"grpc": {"port": 0}}}`,
	} {
		if _, err := ParseProbers(in, "127.0.0.1"); err == nil || !strings.Contains(err.Error(), "-app-probers") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// /stats/prometheus merges Envoy's stats, the pod services' metrics and the
// launcher's own into one valid page; a family two sources share is written once,
// and a source is cut at MaxScrape bytes, never mid-line.
func TestStatsMergedAndBounded(t *testing.T) {
	envoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE envoy_server_live gauge\nenvoy_server_live{} 1\n")
	}))
	t.Cleanup(envoy.Close)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP go_goroutines Goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 7\n"+
			"# TYPE meshagent_sds_edge_pushes_total counter\nmeshagent_sds_edge_pushes_total 3\n")
	}))
	t.Cleanup(svc.Close)
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE big gauge\n")
		for i := range 100000 {
			fmt.Fprintf(w, "big{i=\"%d\"} 1\n", i)
		}
	}))
	t.Cleanup(huge.Close)
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_goroutines", Help: "dup"})
	g.Set(9)
	reg.MustRegister(g, prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshagent_launcher_envoy_up", Help: "up"}))
	base := serve(t, Config{EnvoyStats: func() string { return envoy.URL }, Sources: []string{svc.URL, huge.URL, "http://127.0.0.1:1/metrics"},
		Gatherer: reg, MaxScrape: 4096})
	code, body := testkit.HTTPGet(base + "/stats/prometheus")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	for _, w := range []string{"envoy_server_live{} 1", "meshagent_sds_edge_pushes_total 3", "go_goroutines 7",
		"meshagent_launcher_envoy_up 0", "cut at 4096 bytes", "unreachable"} {
		if !strings.Contains(body, w) {
			t.Errorf("page lacks %q", w)
		}
	}
	if strings.Contains(body, "go_goroutines 9") || strings.Count(body, "# TYPE go_goroutines") != 1 {
		t.Errorf("go_goroutines twice:\n%s", body)
	}
	if len(body) > 3*4096 {
		t.Errorf("page of %d bytes: the huge source was not cut", len(body))
	}
	tp := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := tp.TextToMetricFamilies(strings.NewReader(body)); err != nil {
		t.Errorf("merged page is not valid Prometheus text: %v", err)
	}
}

// /quitquitquit and /drain are POST only and only from the pod itself.
func TestQuitAndDrainArePostOnly(t *testing.T) {
	var quits, drains atomic.Int32
	base := serve(t, Config{Quit: func() { quits.Add(1) }, Drain: func(context.Context) error { drains.Add(1); return nil }})
	for _, p := range []string{"/quitquitquit", "/drain"} {
		if code, _ := testkit.HTTPGet(base + p); code != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: %d", p, code)
		}
		resp, err := http.Post(base+p, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("POST %s: %d", p, resp.StatusCode)
		}
	}
	if quits.Load() != 1 || drains.Load() != 1 {
		t.Fatalf("quits %d drains %d", quits.Load(), drains.Load())
	}
}

// A web page open on the host can send a form POST, or a fetch() with a "simple"
// content type, to any loopback port, and with DNS rebinding it looks same-origin.
// Every such request is refused and neither stops nor drains the proxy; what the
// pod's own hooks send (curl -X POST, a JSON body, PUT) still works.
func TestQuitAndDrainRefuseBrowserRequests(t *testing.T) {
	var quits, drains atomic.Int32
	base := serve(t, Config{Quit: func() { quits.Add(1) }, Drain: func(context.Context) error { drains.Add(1); return nil }})
	do := func(method, path string, hdr map[string]string, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	refused := []struct {
		name string
		hdr  map[string]string
		body string
		why  string
	}{
		{"cross-site form", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site",
			"Content-Type": "application/x-www-form-urlencoded"}, "a=1", "Origin"},
		{"form without Origin or Sec-Fetch (an old browser)", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, "a=1", "form"},
		{"multipart form", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, "--x--\r\n", "form"},
		{"fetch text/plain", map[string]string{"Content-Type": "Text/Plain;charset=UTF-8"}, "{}", "form"},
		{"unparsable content type", map[string]string{"Content-Type": "text/plain;;="}, "", "form"},
		{"same-site page on another port", map[string]string{"Sec-Fetch-Site": "same-site"}, "", "Sec-Fetch-Site"},
		{"DNS rebinding (looks same-origin)", map[string]string{"Origin": "http://rebind.example:15020",
			"Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}, "{}", "Origin"},
		{"Origin null (sandboxed frame)", map[string]string{"Origin": "null"}, "", "Origin"},
	}
	for _, p := range []string{"/quitquitquit", "/drain"} {
		for _, m := range []string{http.MethodPost, http.MethodPut} {
			for _, c := range refused {
				t.Run(p+" "+m+" "+c.name, func(t *testing.T) {
					code, body := do(m, p, c.hdr, c.body)
					if code != http.StatusForbidden || !strings.Contains(body, c.why) {
						t.Errorf("%d %q", code, body)
					}
				})
			}
		}
	}
	// State: nothing was stopped or drained.
	if quits.Load() != 0 || drains.Load() != 0 {
		t.Fatalf("after refused requests: quits %d drains %d", quits.Load(), drains.Load())
	}
	// What preStop hooks and operators send still works: curl -X POST (no body, no
	// Content-Type), a JSON body, PUT, and a navigation-like Sec-Fetch-Site: none.
	allowed := []struct {
		method string
		hdr    map[string]string
		body   string
	}{
		{http.MethodPost, map[string]string{"User-Agent": "curl/8.5.0", "Accept": "*/*"}, ""},
		{http.MethodPost, map[string]string{"Content-Type": "application/json"}, "{}"},
		{http.MethodPut, nil, ""},
		{http.MethodPost, map[string]string{"Sec-Fetch-Site": "none"}, ""},
	}
	for _, a := range allowed {
		if code, body := do(a.method, "/drain", a.hdr, a.body); code != 200 {
			t.Errorf("%s /drain %v: %d %s", a.method, a.hdr, code, body)
		}
	}
	if drains.Load() != int32(len(allowed)) {
		t.Fatalf("drains %d, want %d", drains.Load(), len(allowed))
	}
}

func TestReadyReportsWhy(t *testing.T) {
	base := serve(t, Config{Ready: func(context.Context) error { return fmt.Errorf("envoy not ready yet") }})
	if code, body := testkit.HTTPGet(base + "/healthz/ready"); code != 503 || !strings.Contains(body, "envoy not ready yet") {
		t.Fatalf("%d %s", code, body)
	}
}

// The application's metrics (Istio's ISTIO_PROMETHEUS_ANNOTATIONS merge) come
// last on /stats/prometheus, from a real HTTP app, in the text format whatever
// the app prefers, cut at MaxScrape; an app that hangs costs AppTimeout, and the
// page still answers with everything else.
func TestAppMetricsMergedAndBounded(t *testing.T) {
	var accept atomic.Value
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept.Store(r.Header.Get("Accept"))
		if r.URL.Path != "/custom/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "# HELP app_requests_total Requests.\n# TYPE app_requests_total counter\napp_requests_total{code=\"200\"} 42\n"+
			"# TYPE go_goroutines gauge\ngo_goroutines 99\n")
		for i := range 10000 {
			fmt.Fprintf(w, "app_requests_total{code=\"%d\"} 1\n", i)
		}
	}))
	t.Cleanup(app.Close)
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_goroutines", Help: "launcher's"}))
	base := serve(t, Config{Gatherer: reg, MaxScrape: 2048, AppMetrics: app.URL + "/custom/metrics", AppTimeout: 2 * time.Second})
	code, body := testkit.HTTPGet(base + "/stats/prometheus")
	if code != 200 || !strings.Contains(body, `app_requests_total{code="200"} 42`) || !strings.Contains(body, "# source app: cut at 2048 bytes") {
		t.Fatalf("%d, page lacks the app's metrics or their bound:\n%s", code, body)
	}
	if strings.Contains(body, "go_goroutines 99") {
		t.Errorf("the app's go_goroutines repeated a family the launcher serves:\n%s", body)
	}
	if a, _ := accept.Load().(string); !strings.HasPrefix(a, "text/plain") {
		t.Errorf("the app was asked for %q, want the text format", a)
	}
	tp := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := tp.TextToMetricFamilies(strings.NewReader(body)); err != nil {
		t.Errorf("merged page is not valid Prometheus text: %v", err)
	}

	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); hung.Close() })
	base = serve(t, Config{Gatherer: reg, AppMetrics: hung.URL + "/metrics", AppTimeout: 300 * time.Millisecond})
	start := time.Now()
	code, body = testkit.HTTPGet(base + "/stats/prometheus")
	if d := time.Since(start); code != 200 || d > 3*time.Second || !strings.Contains(body, "# source app: timed out") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("a hung app: %d after %s:\n%s", code, d, body)
	}
}
