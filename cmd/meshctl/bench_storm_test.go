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
// STORM_PODS (default 1000,5000,10000) and each node tier in STORM_NODES
// (default 0,50: the direct layout, and the fleet's, the pods spread over 50
// node agents that bench storm starts against the hub's leaf listener), and
// runs `meshctl bench storm` against it as another process: every simulated pod
// with its own key, CSR and pod-bound token (node-bound on the node tier) and
// its connections (STORM_CONNS, default 1: `meshagent pod`, the layout for a
// large fleet; 3 is the three-process pod) connecting at once — to its node
// agent, or to the hub — and asking for its certificate, then a root rotation
// (STORM_ROTATE: new-key by default, same-key, or none; none past
// loadgen.MaxInProcess connections, where the pods run in worker
// processes) that every live pod follows on the rotator's renew commands. It
// reports the seconds until the last pod was certified, failures, wasted work,
// the hub's connections at the peak, each process's CPU per pod and the hub's
// memory per connection bench storm read, and the rotation's seconds and pods
// per second. The six default storms take about ten minutes on a quiet machine.
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
	tiers := os.Getenv("STORM_NODES")
	if tiers == "" {
		tiers = "0,50"
	}
	perPod, err := strconv.Atoi(conns)
	if err != nil || perPod < 1 {
		b.Fatalf("STORM_CONNS=%q: want 1 to 3", conns)
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("STORM_PODS=%q: want sizes like 1000,5000", sizes)
		}
		for _, t := range strings.Split(tiers, ",") {
			nodes, err := strconv.Atoi(strings.TrimSpace(t))
			if err != nil || nodes < 0 {
				b.Fatalf("STORM_NODES=%q: want node counts like 0,50", tiers)
			}
			rot := rotate
			if n*perPod > loadgen.MaxInProcess {
				rot = loadgen.RotateNone // the pods run in workers, which a rotation does not follow
			}
			benchStorm(b, bin, n, nodes, conns, rot)
		}
	}
}

// benchStorm is one storm of BenchmarkStorm.
func benchStorm(b *testing.B, bin string, n, nodes int, conns, rotate string) {
	b.Run(fmt.Sprintf("pods=%d/conns=%s/nodes=%d", n, conns, nodes), func(b *testing.B) {
		for range b.N {
			r := storm(b, bin, n, nodes, conns, rotate)
			b.ReportMetric(r.Seconds, "storm_s")
			b.ReportMetric(float64(r.Failed), "failed")
			b.ReportMetric(float64(r.Wasted), "wasted")
			b.ReportMetric(float64(r.HubConns), "hub_conns")
			b.ReportMetric(r.SignerCPUMicroPerPod, "signer_us/pod")
			b.ReportMetric(r.NATSCPUMicroPerPod, "nats_us/pod")
			b.ReportMetric(r.NodesCPUMicroPerPod, "node_agents_us/pod")
			b.ReportMetric(r.ClientCPUMicroPerPod, "client_us/pod")
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

func storm(b *testing.B, bin string, pods, nodes int, conns, rotate string) loadgen.StormResult {
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
	run := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), "bench", "storm", "-dir", dir, "-pods", strconv.Itoa(pods), "-nodes", strconv.Itoa(nodes),
		"-conns", conns, "-rotate", rotate, "-bin-dir", bin, "-o", "json")
	run.Stdout, run.Stderr = &out, &errb
	if err := run.Run(); err != nil {
		b.Fatalf("bench storm: %v\n%s", err, errb.String())
	}
	var r loadgen.StormResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		b.Fatalf("bench storm -o json: %v\n%s", err, out.String())
	}
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("%s: pods=%d nodes=%d certified=%d failed=%d wasted=%d (admissions %d, certificates %d) in %.2f s hub_conns=%d; admitted %.0f by the hub (cache hits %.0f), %.0f by node agents, busy %.0f, dropped %.0f; signer %.0f µs/pod, hub nats %.0f µs/pod, node agents %.0f µs/pod, load client %.0f µs/pod, %.1f KiB/conn; load %s",
		st.NATSURL, r.Pods, r.Nodes, r.Certified, r.Failed, r.Wasted, r.WastedAdmissions, r.WastedCerts, r.Seconds, r.HubConns, r.Admitted, r.CacheHits, r.NodeAdmitted, r.Busy, r.Dropped,
		r.SignerCPUMicroPerPod, r.NATSCPUMicroPerPod, r.NodesCPUMicroPerPod, r.ClientCPUMicroPerPod, r.NATSBytesPerConn/1024, strings.TrimSpace(string(load)))
	for e, n := range r.ConnectErrors {
		b.Logf("retried %d connects after: %s", n, e)
	}
	return r
}
