package signer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/testkit"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
)

// realCSRs is how many CSRs each real-binary run sends: enough for a p99 (≥ 2,000).
const realCSRs = 3000

// signBench is the part of meshctl bench sign's -o json this benchmark reads.
type signBench struct {
	CSRs      int     `json:"csrs"`
	Rate      float64 `json:"csrs_per_second"`
	P50Micro  int64   `json:"p50_us"`
	P99Micro  int64   `json:"p99_us"`
	CPUMicro  float64 `json:"signer_cpu_us_per_csr"`
	CPUSource string  `json:"cpu_source"`
}

// BenchmarkSignRealBinary is the headline signer figure: the real signer binary on
// a TCP (loopback) nats-server, loaded by meshctl bench sign in its own process (32
// in flight, pre-minted tokens, pre-generated P-256 CSRs), beside the in-process
// crypto ceiling (CSR parse and verify, certificate, PEM) in the same run, rounds
// times alternating; medians. ratio-wall is CSRs/s over the ceiling's; ratio-cpu is
// the ceiling's CPU per CSR over the signer process's (from /proc/<pid>/stat), the
// robust one on a shared machine; ratio-cpu-jwt is the same against the ceiling plus
// the per-request ES256 token verification the bus path still does. Binaries come from MESHAGENT_BIN (make bench), else
// are built. Run with -benchtime 1x.
func BenchmarkSignRealBinary(b *testing.B) {
	bin := benchBinaries(b)
	dir := testkit.ShortDir(b)
	ns, err := embedded.Start(embedded.Config{Port: -1, StoreDir: filepath.Join(dir, "nats")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	iss := signertest.NewIssuer(b, "meshagent-dev")
	jwks := iss.WriteJWKS(b, dir)
	httpAddr := testkit.FreeAddr(b)
	signer := exec.Command(filepath.Join(bin, "signer"), "-instance", "bench-0", "-nats-url", ns.ClientURL(),
		"-http-addr", httpAddr, "-grpc-addr", testkit.FreeAddr(b), "-jwks-file", jwks,
		"-ca-kek-file", signertest.KEKFile(b), "-log-level", "warn")
	var logs bytes.Buffer
	signer.Stdout, signer.Stderr = &logs, &logs
	if err := signer.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = signer.Process.Kill(); _ = signer.Wait() })
	testkit.EventuallyWithin(b, 30*time.Second, "signer ready", func() bool {
		code, _ := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == http.StatusOK
	})
	// Pre-minted tokens, one service account each, as a fleet holds them.
	var toks strings.Builder
	for i := range realCSRs {
		toks.WriteString(iss.Mint(b, iss.ServiceAccount("bench", fmt.Sprintf("w%d", i), time.Now().Add(-time.Second), 2*time.Hour)) + "\n")
	}
	tokFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokFile, []byte(toks.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	load := func() signBench {
		return meshctlBenchSign(b, bin, &logs, "-nats-url", ns.ClientURL(), "-tokens", tokFile, "-signer-pid", strconv.Itoa(signer.Process.Pid))
	}
	c := newCeiling(b, pki.ECP256, realCSRs)
	var runs []signBench
	var wall, cpu, cpuJWT, ceilRate, ceilCPU, jwtCPU []float64
	for range rounds {
		ceil, withJWT, r := c.run(b, false), c.run(b, true), load()
		jwtCPU = append(jwtCPU, float64(withJWT.cpuPerCSR().Microseconds()))
		cpuJWT = append(cpuJWT, float64(withJWT.cpuPerCSR())/float64(time.Duration(r.CPUMicro*1e3)))
		runs = append(runs, r)
		ceilRate = append(ceilRate, ceil.rate())
		ceilCPU = append(ceilCPU, float64(ceil.cpuPerCSR().Microseconds()))
		wall = append(wall, r.Rate/ceil.rate())
		cpu = append(cpu, float64(ceil.cpuPerCSR())/float64(time.Duration(r.CPUMicro*1e3)))
	}
	med := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	slices.SortFunc(runs, func(x, y signBench) int { return int(x.Rate - y.Rate) })
	m := runs[len(runs)/2]
	b.ReportMetric(m.Rate, "CSRs/s")
	b.ReportMetric(float64(m.P50Micro), "p50-µs")
	b.ReportMetric(float64(m.P99Micro), "p99-µs")
	b.ReportMetric(m.CPUMicro, "signer-cpu-µs/CSR")
	b.ReportMetric(med(ceilRate), "ceiling-CSRs/s")
	b.ReportMetric(med(ceilCPU), "ceiling-cpu-µs/CSR")
	b.ReportMetric(med(wall), "ratio-wall")
	b.ReportMetric(med(cpu), "ratio-cpu")
	b.ReportMetric(med(jwtCPU), "ceiling-jwt-cpu-µs/CSR")
	b.ReportMetric(med(cpuJWT), "ratio-cpu-jwt")
	b.ReportMetric(0, "ns/op")
	b.Logf("real signer over TCP NATS, P-256, %d in flight, n=%d per run, %d rounds: %.0f CSRs/s (p50 %dµs, p99 %dµs, signer CPU %.0fµs/CSR); ceiling %.0f CSRs/s, %.0fµs/CSR; median ratios wall %.2f, CPU %.2f; ceiling with the ES256 token verified %.0fµs/CSR, CPU ratio to it %.2f",
		clients, realCSRs, rounds, m.Rate, m.P50Micro, m.P99Micro, m.CPUMicro, med(ceilRate), med(ceilCPU), med(wall), med(cpu), med(jwtCPU), med(cpuJWT))
}

// meshctlBenchSign runs meshctl bench sign (realCSRs P-256 CSRs, clients in
// flight, json) with args and decodes its result; logs is the signer's output, shown
// when it fails.
func meshctlBenchSign(b *testing.B, bin string, logs *bytes.Buffer, args ...string) signBench {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), append([]string{"bench", "sign", "-n", strconv.Itoa(realCSRs),
		"-in-flight", strconv.Itoa(clients), "-key-alg", string(pki.ECP256), "-o", "json"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		b.Fatalf("meshctl bench sign: %v\n%s\nsigner log:\n%s", err, stderr, logs.String())
	}
	var r signBench
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("meshctl bench sign output %q: %v", out, err)
	}
	if r.CPUSource == "" {
		b.Fatalf("meshctl bench sign read no signer CPU: %s", out)
	}
	return r
}

// BenchmarkSignRealBinaryBusID measures what -bus-sign-id saves: the real signer
// binary on a secured TCP nats-server, serving the auth callout and run with
// -bus-sign-id; meshctl bench sign connects 32 pods (pod-bound tokens, admitted by
// the callout) and signs on their sign.pod subjects (token verified per request,
// "pod") and on their sign.id subjects (identity from the subject, "id"), alternating
// with the in-process crypto ceiling, rounds times; medians. ratio-cpu-* is the
// ceiling's CPU per CSR over the signer's; id/pod-cpu is the id path's signer CPU per
// CSR over the pod path's. Run with -benchtime 1x.
func BenchmarkSignRealBinaryBusID(b *testing.B) {
	bin := benchBinaries(b)
	dir := testkit.ShortDir(b)
	creds, err := policy.LoadOrGenerate(filepath.Join(dir, "secrets"))
	if err != nil {
		b.Fatal(err)
	}
	ns, err := embedded.Start(embedded.Config{Port: -1, StoreDir: filepath.Join(dir, "nats"), Auth: &creds.Keys})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	iss := signertest.NewIssuer(b, "meshagent-dev")
	httpAddr := testkit.FreeAddr(b)
	signer := exec.Command(filepath.Join(bin, "signer"), "-instance", "bench-0", "-nats-url", ns.ClientURL(),
		"-nats-nkey", creds.SeedFile(policy.Signer), "-bus-callout-seed", creds.IssuerFile(),
		"-bus-callout-nkey", creds.SeedFile(policy.Callout), "-bus-sign-id",
		"-http-addr", httpAddr, "-grpc-addr", testkit.FreeAddr(b), "-jwks-file", iss.WriteJWKS(b, dir),
		"-ca-kek-file", signertest.KEKFile(b), "-log-level", "warn")
	var logs bytes.Buffer
	signer.Stdout, signer.Stderr = &logs, &logs
	if err := signer.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = signer.Process.Kill(); _ = signer.Wait() })
	testkit.EventuallyWithin(b, 30*time.Second, "signer ready", func() bool {
		code, _ := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == http.StatusOK
	})
	// One pod-bound token per pod connection.
	var toks strings.Builder
	for i := range clients {
		sa := iss.ServiceAccount("bench", fmt.Sprintf("w%d", i), time.Now().Add(-time.Second), 2*time.Hour)
		toks.WriteString(iss.Mint(b, sa.ForPod(fmt.Sprintf("w%d-0", i))) + "\n")
	}
	tokFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokFile, []byte(toks.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	load := func(subject string) signBench {
		return meshctlBenchSign(b, bin, &logs, "-nats-url", ns.ClientURL(), "-tokens", tokFile,
			"-signer-pid", strconv.Itoa(signer.Process.Pid), "-subject", subject)
	}
	c := newCeiling(b, pki.ECP256, realCSRs)
	var ceilCPU, podCPU, idCPU, podRate, idRate, ratioPod, ratioID, idOverPod []float64
	for range rounds {
		ceil, pod, id := c.run(b, false), load("pod"), load("id")
		ceilCPU = append(ceilCPU, float64(ceil.cpuPerCSR().Microseconds()))
		podCPU, idCPU = append(podCPU, pod.CPUMicro), append(idCPU, id.CPUMicro)
		podRate, idRate = append(podRate, pod.Rate), append(idRate, id.Rate)
		ratioPod = append(ratioPod, float64(ceil.cpuPerCSR().Microseconds())/pod.CPUMicro)
		ratioID = append(ratioID, float64(ceil.cpuPerCSR().Microseconds())/id.CPUMicro)
		idOverPod = append(idOverPod, id.CPUMicro/pod.CPUMicro)
	}
	med := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	b.ReportMetric(med(podRate), "pod-CSRs/s")
	b.ReportMetric(med(idRate), "id-CSRs/s")
	b.ReportMetric(med(podCPU), "pod-signer-cpu-µs/CSR")
	b.ReportMetric(med(idCPU), "id-signer-cpu-µs/CSR")
	b.ReportMetric(med(ceilCPU), "ceiling-cpu-µs/CSR")
	b.ReportMetric(med(ratioPod), "ratio-cpu-pod")
	b.ReportMetric(med(ratioID), "ratio-cpu-id")
	b.ReportMetric(med(idOverPod), "id/pod-cpu")
	b.ReportMetric(0, "ns/op")
	b.Logf("real signer, secured TCP NATS, %d callout-admitted pods, P-256, n=%d per run, %d rounds (medians): sign.pod %.0f CSRs/s, %.0fµs CPU/CSR; sign.id %.0f CSRs/s, %.0fµs CPU/CSR; ceiling %.0fµs/CSR; CPU ratio to the ceiling pod %.2f, id %.2f; id/pod CPU %.2f (per run: %v)",
		clients, realCSRs, rounds, med(podRate), med(podCPU), med(idRate), med(idCPU), med(ceilCPU), med(ratioPod), med(ratioID), med(idOverPod), idOverPod)
}

// benchBinaries returns MESHAGENT_BIN (make bench builds it), or a directory with
// the signer and meshctl built as make build does.
func benchBinaries(b *testing.B) string {
	if d := os.Getenv("MESHAGENT_BIN"); d != "" {
		return d
	}
	dir := b.TempDir()
	if err := testkit.BuildServices(dir, "signer"); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", filepath.Join(dir, "meshctl"), "github.com/meshagent/meshagent/cmd/meshctl")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build meshctl: %v\n%s", err, out)
	}
	return dir
}
