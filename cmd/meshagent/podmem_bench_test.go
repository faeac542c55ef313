package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

// BenchmarkPodMemory starts `meshctl up` from MESHAGENT_BIN twice — each pod as
// three processes of the shared executable, then as one `meshagent pod` — and
// reports, once the pod's Envoy stand-in holds its SDS stream and is ready, the
// pod's RSS, anonymous memory and PSS (/proc/<pid>/smaps_rollup, summed over the
// pod's meshagent processes, Envoy excluded), and each role's anonymous memory.
//
// PODMEM_IDLE (a duration, default 3s) is how long the pod idles before it is
// measured. At 3 s a pod has usually not run a GC yet (the runtime forces one
// every two minutes only after a first one); a longer idle takes in `meshctl
// up`'s certificate renewals (2-minute TTL), whose allocations bring one.
//
// With PILOT_AGENT_BIN set to an Istio pilot-agent binary (docs/benchmarks.md says
// how it was built), pilot-agent runs in the first stack beside the pod, as a
// sidecar agent of the same signer and control plane with the same stand-in as its
// Envoy (pilotAgentMemory), and its memory and the ratios to it are reported too.
func BenchmarkPodMemory(b *testing.B) {
	bin := os.Getenv("MESHAGENT_BIN")
	if bin == "" {
		b.Skip("MESHAGENT_BIN not set (make bench sets it)")
	}
	for _, f := range []string{"meshctl", "meshagent"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			b.Skipf("no %s in MESHAGENT_BIN: %v", f, err)
		}
	}
	idle := 3 * time.Second
	if v := os.Getenv("PODMEM_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("PODMEM_IDLE=%q: want a positive duration", v)
		}
		idle = d
	}
	pa := os.Getenv("PILOT_AGENT_BIN")
	if pa == "" {
		b.Log("PILOT_AGENT_BIN not set: no pilot-agent figures")
	}
	for range b.N {
		three, pilot := podMemory(b, bin, pa, idle)
		one, _ := podMemory(b, bin, "", idle, "-one-process-pods")
		b.ReportMetric(three.sum["Pss"], "pod_pss_MB")
		b.ReportMetric(three.sum["Rss"], "pod_rss_MB")
		b.ReportMetric(three.sum["Anonymous"], "pod_anon_MB")
		for _, role := range podOrder {
			b.ReportMetric(three.roles[role]["Anonymous"], role+"_anon_MB")
		}
		b.ReportMetric(one.sum["Pss"], "pod1_pss_MB")
		b.ReportMetric(one.sum["Rss"], "pod1_rss_MB")
		b.ReportMetric(one.sum["Anonymous"], "pod1_anon_MB")
		b.ReportMetric(one.sum["Pss"]/three.sum["Pss"], "ratio_pss_one_vs_three")
		if pilot != nil {
			b.ReportMetric(pilot["Pss"], "pilot_agent_pss_MB")
			b.ReportMetric(pilot["Rss"], "pilot_agent_rss_MB")
			b.ReportMetric(pilot["Anonymous"], "pilot_agent_anon_MB")
			b.ReportMetric(three.sum["Pss"]/pilot["Pss"], "ratio_pss_three_vs_pilot_agent")
			b.ReportMetric(one.sum["Pss"]/pilot["Pss"], "ratio_pss_one_vs_pilot_agent")
		}
	}
}

// podMem is one pod's memory in MB: the sum over its processes, and each role's
// process (three-process pods only).
type podMem struct {
	sum   map[string]float64
	roles map[string]map[string]float64
}

// podMemory runs one stack with one pod and returns the pod's memory, and, when pa
// names a pilot-agent binary, pilot-agent's beside it in the same stack.
func podMemory(b *testing.B, bin, pa string, idle time.Duration, flags ...string) (podMem, map[string]float64) {
	b.Helper()
	dir := b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute+2*idle)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), append([]string{"up", "-dir", dir,
		"-dashboard-addr", "127.0.0.1:0", "-bin-dir", bin}, flags...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "envoy.ready") {
	}
	go func() { // keep draining meshctl's output
		for sc.Scan() {
		}
	}()
	if ctx.Err() != nil {
		b.Fatalf("no envoy.ready from meshctl up %v", flags)
	}
	if !testkit.Idle(ctx, idle) { // idle, one SDS stream
		b.Fatalf("meshctl up %v ended before the pod's %s idle", flags, idle)
	}
	m := podMem{sum: map[string]float64{}, roles: map[string]map[string]float64{}}
	for _, pid := range children(b, cmd.Process.Pid) {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if filepath.Base(exe) != "meshagent" {
			continue
		}
		role := map[string]float64{}
		for k, v := range smapsRollup(b, pid) {
			role[k] = v / 1024
			m.sum[k] += v / 1024
		}
		m.roles[roleOf(pid)] = role
	}
	if m.sum["Pss"] == 0 {
		b.Fatalf("no meshagent process under meshctl up %v", flags)
	}
	if pa == "" {
		return m, nil
	}
	return m, pilotAgentMemory(b, dir, bin, pa, idle)
}

// roleOf is the role a meshagent process runs: its first argument.
func roleOf(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if args := strings.Split(string(data), "\x00"); len(args) > 1 {
		return args[1]
	}
	return ""
}

func children(b *testing.B, pid int) []int {
	b.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var pids []int
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
	}
	return pids
}

// smapsRollup reads Rss, Pss and Anonymous (kB) of pid.
func smapsRollup(b *testing.B, pid int) map[string]float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatal(err)
	}
	got := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && (f[0] == "Rss:" || f[0] == "Pss:" || f[0] == "Anonymous:") {
			v, _ := strconv.ParseFloat(f[1], 64)
			got[strings.TrimSuffix(f[0], ":")] = v
		}
	}
	return got
}
