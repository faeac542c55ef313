package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/tests/testkit"
)

// operatorShapes are the page shapes of issue 36's bar against a `meshctl up`
// stack whose fleet meshctl bench sign seeded in namespace perf.
var operatorShapes = []struct{ name, query string }{
	{"first-page", ""}, {"filter-ns", "ns=perf"}, {"sort-pod-offset-5000", "ns=perf&sort=pod&offset=5000"},
	{"one-pod", "pod=default/demo-0"}, {"expiry-1h", "expiry=1h"},
}

// BenchmarkOperatorFleet starts `meshctl up -pods 1` from MESHAGENT_BIN with the
// operator on the manifest's memory settings (a 256 MiB limit: GOMEMLIMIT and GOGC follow), seeds
// OPERATOR_CERTS certificates (default 1000,100000) through the real signer
// (`meshctl bench sign -ns perf`), and reports, for each size: the operator's CPU
// per page of each shape (300 pages, /proc), its RSS, the seconds from a kill -9
// to ready and to caught up (its pages without "loading"), and the wall seconds
// of meshctl status, check, describe pod and certs -limit 50.
func BenchmarkOperatorFleet(b *testing.B) {
	bin := os.Getenv("MESHAGENT_BIN")
	if bin == "" {
		b.Skip("MESHAGENT_BIN not set (make bench sets it)")
	}
	sizes := orDefault(os.Getenv("OPERATOR_CERTS"), "1000,100000")
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("OPERATOR_CERTS=%q: want sizes like 1000,100000", sizes)
		}
		b.Run(fmt.Sprintf("certs=%d", n), func(b *testing.B) {
			for range b.N {
				operatorFleet(b, bin, n)
			}
		})
	}
}

func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func operatorFleet(b *testing.B, bin string, n int) {
	dir := testkit.ShortDir(b)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	// A fixed port: the supervisor starts the killed operator again on it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	up := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), "up", "-dir", dir, "-pods", "1", "-nats-port", "-1",
		"-dashboard-addr", addr, "-bin-dir", bin)
	up.Env = append(os.Environ(), "MEMORY_LIMIT=268435456") // as the manifest: GOMEMLIMIT and GOGC follow
	up.Cancel = func() error { return up.Process.Signal(os.Interrupt) }
	up.WaitDelay = 30 * time.Second
	if err := up.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = up.Wait() }()
	base := "http://" + addr
	testkit.EventuallyWithin(b, 3*time.Minute, "stack up", func() bool {
		if _, err := stackfile.Read(dir); err != nil {
			return false // written once every process is ready
		}
		code, _ := testkit.HTTPGet(base + "/readyz")
		return code == 200
	})
	cli := func(args ...string) (time.Duration, error) {
		start := time.Now()
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), args...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("meshctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return time.Since(start), nil
	}
	if _, err := cli("bench", "sign", "-dir", dir, "-ns", "perf", "-n", strconv.Itoa(n)); err != nil {
		b.Fatal(err)
	}
	testkit.EventuallyWithin(b, 5*time.Minute, "the operator holds the fleet", func() bool {
		p, ok := page(base, "limit=1")
		return ok && p.Loading == nil && p.Counts.Certificates >= n
	})
	pid := operatorPID(b, dir)
	for _, shape := range operatorShapes {
		before := procCPU(b, pid)
		for range 300 {
			if _, ok := page(base, shape.query); !ok {
				b.Fatalf("page %q failed", shape.query)
			}
		}
		b.ReportMetric(float64((procCPU(b, pid)-before).Microseconds())/1000/300, shape.name+"_cpu_ms/page")
	}
	b.ReportMetric(float64(procRSS(b, pid))/(1<<20), "operator_rss_MiB")
	for _, c := range [][]string{{"status", "-dir", dir}, {"check", "-dir", dir}, {"describe", "-dir", dir, "pod", "demo-0"}, {"certs", "-dir", dir, "-limit", "50"}} {
		took, err := cli(c...)
		if err != nil {
			b.Error(err)
			continue
		}
		b.ReportMetric(took.Seconds(), c[0]+"_s")
	}
	// A restart: the supervisor starts the operator again; it is ready once its
	// watch has started, caught up once its pages stop saying "loading".
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	var ready time.Duration
	testkit.EventuallyWithin(b, 5*time.Minute, "the operator caught up after a kill -9", func() bool {
		if code, _ := testkit.HTTPGet(base + "/readyz"); code != 200 {
			return false
		}
		if ready == 0 {
			ready = time.Since(start)
		}
		p, ok := page(base, "limit=1")
		return ok && p.Loading == nil && p.Counts.Certificates >= n
	})
	b.ReportMetric(ready.Seconds(), "ready_after_kill_s")
	b.ReportMetric(time.Since(start).Seconds(), "caught_up_after_kill_s")
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("certs=%d: load %s", n, strings.TrimSpace(string(load)))
}

// page is one /api/inventory answer (false on anything but a 200).
func page(base, query string) (inventory.Page, bool) {
	resp, err := http.Get(base + "/api/inventory?" + query)
	if err != nil {
		return inventory.Page{}, false
	}
	defer resp.Body.Close()
	var p inventory.Page
	return p, resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&p) == nil
}

func operatorPID(b *testing.B, dir string) int {
	st, err := stackfile.Read(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range st.Processes {
		if p.Name == "operator" {
			return p.PID
		}
	}
	b.Fatal("stack.json lists no operator")
	return 0
}

// procCPU is pid's user and system CPU time so far.
func procCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// procRSS is pid's resident set in bytes.
func procRSS(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
