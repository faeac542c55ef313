package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/loadgen"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/tests/testkit"
)

// BenchmarkStorm starts `meshctl up -pods 0` from MESHAGENT_BIN (a real signer,
// rotator and operator, nats-server embedded in meshctl) for each size in
// STORM_PODS (default 1000,5000,10000) and runs `meshctl bench storm` against it
// as another process: every simulated pod with its connections (STORM_CONNS,
// default 1: `meshagent pod`, the layout for a large fleet; 3 is the three-process
// pod, which at 10,000 pods needs more open files than this machine allows a
// process) connecting at once and asking for its certificate, then a root
// rotation (STORM_ROTATE: new-key by default, same-key, or none) that every live
// pod follows on the rotator's renew commands. It reports the seconds until the
// last pod was certified, failures, wasted work, the CPU per pod and memory per
// connection bench storm read, and the rotation's seconds and pods per second.
func BenchmarkStorm(b *testing.B) {
	bin := os.Getenv("MESHAGENT_BIN")
	if bin == "" {
		b.Skip("MESHAGENT_BIN not set (make bench sets it)")
	}
	sizes := os.Getenv("STORM_PODS")
	if sizes == "" {
		sizes = "1000,5000,10000"
	}
	conns := os.Getenv("STORM_CONNS")
	if conns == "" {
		conns = "1"
	}
	rotate := os.Getenv("STORM_ROTATE")
	if rotate == "" {
		rotate = "new-key"
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("STORM_PODS=%q: want sizes like 1000,5000", sizes)
		}
		b.Run(fmt.Sprintf("pods=%d/conns=%s", n, conns), func(b *testing.B) {
			for range b.N {
				r := storm(b, bin, n, conns, rotate)
				b.ReportMetric(r.Seconds, "storm_s")
				b.ReportMetric(float64(r.Failed), "failed")
				b.ReportMetric(float64(r.Wasted), "wasted")
				b.ReportMetric(r.SignerCPUMicroPerPod, "signer_us/pod")
				b.ReportMetric(r.NATSCPUMicroPerPod, "nats_us/pod")
				b.ReportMetric(r.NATSBytesPerConn/1024, "nats_KiB/conn")
				b.ReportMetric(r.Busy, "busy_refusals")
				if r.Certified != n {
					b.Errorf("%d of %d pods certified", r.Certified, n)
				}
				if ro := r.Rotation; ro != nil {
					b.ReportMetric(ro.Seconds, "rotation_s")
					b.ReportMetric(ro.PerSecond, "rotated_pods/s")
					b.ReportMetric(float64(ro.Commands), "renew_commands")
					b.ReportMetric(ro.SignerCPUMicroPerPod, "rotation_signer_us/pod")
					if ro.Rotated != ro.Pods {
						b.Errorf("%d of %d pods certified under the new root", ro.Rotated, ro.Pods)
					}
				}
			}
		})
	}
}

func storm(b *testing.B, bin string, pods int, conns, rotate string) loadgen.StormResult {
	b.Helper()
	dir := testkit.ShortDir(b)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	up := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), "up", "-dir", dir, "-pods", "0", "-nats-port", "-1",
		"-dashboard-addr", "127.0.0.1:0", "-bin-dir", bin)
	up.Cancel = func() error { return up.Process.Signal(os.Interrupt) }
	up.WaitDelay = 30 * time.Second
	if err := up.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = up.Wait() }()
	var st *stackfile.Stack
	testkit.EventuallyWithin(b, 3*time.Minute, "stack up", func() bool {
		s, err := stackfile.Read(dir)
		if err != nil || s.Signer.HTTP == "" {
			return false
		}
		resp, err := http.Get("http://" + s.Signer.HTTP + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		st = s
		return resp.StatusCode == http.StatusOK
	})
	var out, errb bytes.Buffer
	run := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), "bench", "storm", "-dir", dir, "-pods", strconv.Itoa(pods), "-conns", conns, "-rotate", rotate, "-o", "json")
	run.Stdout, run.Stderr = &out, &errb
	if err := run.Run(); err != nil {
		b.Fatalf("bench storm: %v\n%s", err, errb.String())
	}
	var r loadgen.StormResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		b.Fatalf("bench storm -o json: %v\n%s", err, out.String())
	}
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("%s: pods=%d certified=%d failed=%d wasted=%d (admissions %d, certificates %d) in %.2f s; admitted %.0f (cache hits %.0f), busy %.0f, dropped %.0f; signer %.0f µs/pod, nats %.0f µs/pod, %.1f KiB/conn; load %s",
		st.NATSURL, r.Pods, r.Certified, r.Failed, r.Wasted, r.WastedAdmissions, r.WastedCerts, r.Seconds, r.Admitted, r.CacheHits, r.Busy, r.Dropped,
		r.SignerCPUMicroPerPod, r.NATSCPUMicroPerPod, r.NATSBytesPerConn/1024, strings.TrimSpace(string(load)))
	for e, n := range r.ConnectErrors {
		b.Logf("retried %d connects after: %s", n, e)
	}
	return r
}
