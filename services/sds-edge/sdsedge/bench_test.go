package sdsedge_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/sdsedge"
	"github.com/meshagent/meshagent/tests/testkit"
)

// Each benchmark does its whole measurement in one iteration (make bench runs -benchtime 1x).

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func report(b *testing.B, name string, d []time.Duration) {
	p50, p99 := percentile(d, 0.5), percentile(d, 0.99)
	b.ReportMetric(ms(p50), name+"-p50-ms")
	b.ReportMetric(ms(p99), name+"-p99-ms")
	b.Logf("%s: n=%d p50=%.2fms p90=%.2fms p99=%.2fms max=%.2fms", name, len(d), ms(p50), ms(percentile(d, 0.9)), ms(p99), ms(percentile(d, 1)))
}

// coldStart measures service start (New + Run) -> `default` received by a client.
func coldStart(b *testing.B, v *env, alg string, n int) []time.Duration {
	var out []time.Duration
	tok := v.ca.token("default", "web", time.Hour)
	for i := 0; i < n; i++ {
		root := testkit.ShortDir(b)
		writeToken(b, root, tok)
		cfg, err := sdsedge.Load([]string{"-pod", testPod, "-pod-root", root, "-socket", "s", "-key-alg", alg, "-http-addr", "127.0.0.1:0",
			"-nats-url", v.ns.ClientURL(), "-namespace", "default", "-service-account", "web"}, func(string) string { return "" })
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		start := time.Now()
		e, err := sdsedge.New(cfg, lifecycle.Deps{Bus: v.nc})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		<-e.Bound()
		cc, _ := sdsclient.DialUnix(ctx, cfg.SDS.Socket)
		st, err := sdsclient.Open(ctx, cc, "bench", "default")
		if err != nil {
			b.Fatal(err)
		}
		if u, err := st.Recv(); err != nil || !u.Secrets["default"].IsCertificate() {
			b.Fatalf("cold start: %v", err)
		}
		out = append(out, time.Since(start))
		st.Close()
		cc.Close()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	return out
}

func BenchmarkColdStart(b *testing.B) {
	v := newEnv(b)
	coldStart(b, v, "EC-P256", 3) // warm up the process (JIT-free, but caches and pools)
	p256 := coldStart(b, v, "EC-P256", 40)
	rsa := coldStart(b, v, "RSA-2048", 15)
	report(b, "p256", p256)
	report(b, "rsa2048", rsa)
	b.ReportMetric(float64(percentile(rsa, 0.5))/float64(percentile(p256, 0.5)), "rsa/p256-p50")
}

// BenchmarkPushLatency: renew event published -> client holds the new secret.
func BenchmarkPushLatency(b *testing.B) {
	v := newEnv(b)
	p := v.startPod(podOpt{})
	st := p.open(b, p.dial(b), "default")
	cur := recv(b, st).Secrets["default"]
	var lat []time.Duration
	for i := 0; i < 200; i++ {
		serial := pki.SerialHex(leafOf(b, cur))
		start := time.Now()
		renew(b, v.nc, serial)
		cur = recv(b, st).Secrets["default"]
		lat = append(lat, time.Since(start))
	}
	report(b, "push", lat)
}

// BenchmarkRSS builds the real binary, runs it as a child process against embedded
// NATS and the test CA, and reads VmRSS idle and with 100 streams. It also times
// process start -> `default` received.
func BenchmarkRSS(b *testing.B) {
	v := newEnv(b)
	bin := filepath.Join(b.TempDir(), "sds-edge")
	// Built as `make build` builds it (static, -trimpath, grpcnotrace), so make bench hits the build cache.
	build := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", bin, "github.com/meshagent/meshagent/services/sds-edge")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	tok := v.ca.token("default", "web", time.Hour)
	start := func() (*exec.Cmd, string, time.Time) {
		root := testkit.ShortDir(b)
		writeToken(b, root, tok)
		cmd := exec.Command(bin, "-pod", testPod, "-pod-root", root, "-nats-url", v.ns.ClientURL(), "-namespace", "default",
			"-service-account", "web", "-socket", "s", "-http-addr", "127.0.0.1:0", "-log-level", "warn")
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		return cmd, filepath.Join(root, "s"), t0
	}
	stop := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	waitDefault := func(sock string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		cc, _ := sdsclient.DialUnix(ctx, sock)
		defer cc.Close()
		st, err := sdsclient.Open(ctx, cc, "bench", "default")
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	var procStart []time.Duration
	for i := 0; i < 10; i++ {
		cmd, sock, t0 := start()
		waitDefault(sock)
		procStart = append(procStart, time.Since(t0))
		stop(cmd)
	}
	report(b, "process-start", procStart)

	cmd, sock, _ := start()
	defer stop(cmd)
	waitDefault(sock)
	time.Sleep(500 * time.Millisecond) // let start-up garbage be collected: idle means idle
	idle, idleAnon, idleFile := rss(b, cmd.Process.Pid)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc, _ := sdsclient.DialUnix(ctx, sock)
	defer cc.Close()
	for i := 0; i < 100; i++ {
		st, err := sdsclient.Open(ctx, cc, "bench", "default", "ROOTCA")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	busy, busyAnon, _ := rss(b, cmd.Process.Pid)
	b.ReportMetric(idle, "idle-rss-MB")
	b.ReportMetric(idleAnon, "idle-anon-MB")
	b.ReportMetric(busy, "100-streams-rss-MB")
	b.ReportMetric(busyAnon, "100-streams-anon-MB")
	b.Logf("rss: idle=%.1fMB (anon %.1f, file-backed %.1f: the binary's own pages, shared between pods) with-100-streams=%.1fMB (anon %.1f)",
		idle, idleAnon, idleFile, busy, busyAnon)
}

// rss reads VmRSS, RssAnon and RssFile (MB) of pid.
func rss(b *testing.B, pid int) (total, anon, file float64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	get := func(key string) float64 {
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, key+":"); ok {
				kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
				return float64(kb) / 1024
			}
		}
		b.Fatalf("no %s in /proc/%d/status", key, pid)
		return 0
	}
	return get("VmRSS"), get("RssAnon"), get("RssFile")
}
