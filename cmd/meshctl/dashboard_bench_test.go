package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/tests/testkit"
)

// dashboardDone is installed in every new document of a measured tab, before the
// page's own script runs: it records, on the page's clock (performance.now(), ms
// since the navigation started), the first moment the dashboard is complete as
// TestDashboardInChromium reads it — the live feed connected, the summary counting
// the whole fleet, the range and table showing the first page, one timeline lane
// per row and the roots drawn.
const dashboardDone = `(() => {
  const want = %s;
  const done = () => {
    const q = (s) => document.querySelector(s);
    return !!q('#conn.live') && (q('#summary')?.textContent || "").includes(want.total + "certificates") &&
      q('#range')?.textContent === "1–" + want.rows + " of " + want.total &&
      document.querySelectorAll('#certs tbody tr').length === want.rows &&
      document.querySelectorAll('#timeline rect.valid').length === want.rows &&
      document.querySelectorAll('#roots .root').length >= 1;
  };
  const check = () => { if (window.__dashboardDone === undefined && done()) window.__dashboardDone = performance.now(); };
  new MutationObserver(check).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
})()`

// dashboardSide is one stack the benchmark opens the dashboard of.
type dashboardSide struct {
	name        string
	dir, base   string
	total, rows int
	// per load: the page's own time to complete, the wall time from asking for the
	// page to seeing it complete, the operator's CPU over that time, the browser's
	// time in script and in layout and style until then (Performance.getMetrics),
	// and what the page had done: API requests, layouts, feed events
	page, wall, cpu, script, layout []time.Duration
	loads                           []string
}

// BenchmarkDashboardInChromium times the operator's dashboard in a real headless
// Chromium until it is complete (dashboardDone), against two `meshctl up -pods 5`
// stacks from MESHAGENT_BIN side by side: one with its 5 certificates, one with
// DASHBOARD_CERTS in all (default 100,000: the 5 and the rest through the real
// signer, `meshctl bench sign -ns perf`), the operators on the manifest's memory
// settings. DASHBOARD_LOADS loads of each (default 7), alternating, each in a new
// tab of one browser after an unmeasured warm-up load; it reports the medians and
// their ratio (issue 36: ≤ 2), and the operator's CPU per load.
func BenchmarkDashboardInChromium(b *testing.B) {
	bin := os.Getenv("MESHAGENT_BIN")
	if bin == "" {
		b.Skip("MESHAGENT_BIN not set (make bench sets it)")
	}
	browser := chromium(b)
	total, err := strconv.Atoi(orDefault(os.Getenv("DASHBOARD_CERTS"), "100000"))
	if err != nil || total <= 5 {
		b.Fatalf("DASHBOARD_CERTS=%q: want a number of certificates above 5", os.Getenv("DASHBOARD_CERTS"))
	}
	loads, err := strconv.Atoi(orDefault(os.Getenv("DASHBOARD_LOADS"), "7"))
	if err != nil || loads < 1 {
		b.Fatalf("DASHBOARD_LOADS=%q: want a number of loads", os.Getenv("DASHBOARD_LOADS"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	small := upDashboardStack(ctx, b, bin, "certs=5")
	small.total, small.rows = 5, 5
	big := upDashboardStack(ctx, b, bin, fmt.Sprintf("certs=%d", total))
	big.total, big.rows = total, min(total, 100)
	start := time.Now()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), "bench", "sign", "-dir", big.dir, "-ns", "perf",
		"-n", strconv.Itoa(total-5), "-request-timeout", "5m").CombinedOutput()
	if err != nil {
		b.Fatalf("bench sign: %v\n%s", err, out)
	}
	b.Logf("seeded %d certificates through the signer in %s", total-5, time.Since(start).Round(time.Second))
	for _, s := range []*dashboardSide{small, big} {
		testkit.EventuallyWithin(b, 5*time.Minute, s.name+": the operator holds the fleet", func() bool {
			p, ok := page(s.base, "limit=1")
			return ok && p.Loading == nil && p.Counts.Certificates == s.total
		})
	}

	actx, cancelA := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-dev-shm-usage", true))...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		b.Fatalf("start chromium: %v", err)
	}
	b.ResetTimer()
	for range b.N {
		for i := range loads + 1 { // the first of each side warms up, unmeasured
			for _, s := range []*dashboardSide{small, big} {
				openDashboard(b, bctx, s, i > 0)
			}
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, s := range []*dashboardSide{small, big} {
		b.ReportMetric(ms(median(s.page)), s.name+"_page_ms")
		b.ReportMetric(ms(median(s.wall)), s.name+"_wall_ms")
		b.ReportMetric(ms(median(s.cpu)), s.name+"_operator_cpu_ms")
		b.ReportMetric(ms(median(s.script)), s.name+"_script_ms")
		b.ReportMetric(ms(median(s.layout)), s.name+"_layout_ms")
		b.Logf("%s: page %v, wall %v, operator CPU %v, script %v, layout and style %v; %s", s.name, s.page, s.wall, s.cpu, s.script, s.layout, strings.Join(s.loads, "; "))
	}
	b.ReportMetric(float64(median(big.page))/float64(median(small.page)), "ratio_page")
	b.ReportMetric(float64(median(big.wall))/float64(median(small.wall)), "ratio_wall")
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load %s", strings.TrimSpace(string(load)))
}

// upDashboardStack starts `meshctl up -pods 5` from bin with its dashboard on a free
// port and the operator on the manifest's memory settings; it stops with ctx.
func upDashboardStack(ctx context.Context, b *testing.B, bin, name string) *dashboardSide {
	dir := testkit.ShortDir(b)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	ctx, cancel := context.WithCancel(ctx)
	up := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), "up", "-dir", dir, "-pods", "5", "-nats-port", "-1",
		"-dashboard-addr", addr, "-bin-dir", bin)
	up.Env = append(os.Environ(), "MEMORY_LIMIT=268435456") // as the manifest: GOMEMLIMIT and GOGC follow
	up.Cancel = func() error { return up.Process.Signal(os.Interrupt) }
	up.WaitDelay = 30 * time.Second
	if err := up.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cancel(); _ = up.Wait() })
	s := &dashboardSide{name: name, dir: dir, base: "http://" + addr}
	testkit.EventuallyWithin(b, 3*time.Minute, name+": stack up", func() bool {
		if _, err := stackfile.Read(dir); err != nil {
			return false // written once every process is ready
		}
		code, _ := testkit.HTTPGet(s.base + "/readyz")
		return code == 200
	})
	return s
}

// openDashboard opens s's dashboard in a new tab of the browser and waits until it
// is complete; keep records the load's figures.
func openDashboard(b *testing.B, bctx context.Context, s *dashboardSide, keep bool) {
	tctx, cancelT := chromedp.NewContext(bctx)
	defer cancelT()
	var mu sync.Mutex
	requests := 0
	err := chromedp.Listen(tctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok && strings.Contains(e.Request.URL, "/api/") {
			mu.Lock()
			requests++
			mu.Unlock()
		}
	})
	if err != nil {
		b.Fatalf("open a tab: %v", err)
	}
	check := fmt.Sprintf(dashboardDone, fmt.Sprintf(`{total: %d, rows: %d}`, s.total, s.rows))
	if err := chromedp.Do(tctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, cdppage.AddScriptToEvaluateOnNewDocument, cdppage.AddScriptToEvaluateOnNewDocumentParams{Source: check})
		if err != nil {
			return err
		}
		_, err = cdp.Call(ctx, t, performance.Enable, performance.EnableParams{})
		return err
	})); err != nil {
		b.Fatalf("install the completeness check: %v", err)
	}
	pid := operatorPID(b, s.dir)
	cpu0, start := procCPU(b, pid), time.Now()
	if err := chromedp.Do(tctx, chromedp.Navigate(s.base+"/")); err != nil {
		b.Fatalf("%s: open the dashboard: %v", s.name, err)
	}
	var took float64
	lctx, cancelL := context.WithTimeout(tctx, 5*time.Minute)
	defer cancelL()
	took, err = chromedp.Run(lctx, chromedp.Evaluate[float64](`new Promise((resolve) => {
  const poll = () => window.__dashboardDone !== undefined ? resolve(window.__dashboardDone) : setTimeout(poll, 5);
  poll();
})`, chromedp.EvalAwaitPromise))
	if err != nil {
		summary, _ := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('#summary').textContent + " | " + document.querySelector('#range').textContent`))
		b.Fatalf("%s: the dashboard was not complete: %v (it shows %q)", s.name, err, summary)
	}
	wall, cpu := time.Since(start), procCPU(b, pid)-cpu0
	if !keep {
		return
	}
	metrics, err := chromedp.Run(tctx, func(ctx context.Context, t *chromedp.Target) (map[string]float64, error) {
		r, err := cdp.Call(ctx, t, performance.GetMetrics, cdp.Empty{})
		if err != nil {
			return nil, err
		}
		m := map[string]float64{}
		for _, v := range r.Metrics {
			m[v.Name] = v.Value
		}
		return m, nil
	})
	if err != nil {
		b.Fatalf("performance metrics: %v", err)
	}
	feed, _ := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('#feed li').length`))
	sec := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	mu.Lock()
	defer mu.Unlock()
	s.page, s.wall, s.cpu = append(s.page, time.Duration(took*float64(time.Millisecond))), append(s.wall, wall), append(s.cpu, cpu)
	s.script = append(s.script, sec(metrics["ScriptDuration"]))
	s.layout = append(s.layout, sec(metrics["LayoutDuration"]+metrics["RecalcStyleDuration"]))
	s.loads = append(s.loads, fmt.Sprintf("%d requests, %.0f layouts, %d feed events", requests, metrics["LayoutCount"], feed))
}
