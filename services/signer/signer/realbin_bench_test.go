package signer

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
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
	// ClientCPUMicro is meshctl's own CPU per CSR; NATSCPUMicro, filled in here,
	// this process's (the nats-server) while the load ran.
	ClientCPUMicro float64 `json:"client_cpu_us_per_csr"`
	NATSCPUMicro   float64 `json:"-"`
	// Writes and Reads are the signer process's write and read system calls per
	// CSR (/proc/<pid>/io), filled in here.
	Writes, Reads float64 `json:"-"`
}

// BenchmarkSignRealBinary is the headline signer figure on sign.any (token per
// request): the real signer binary on a TCP (loopback) nats-server, loaded by
// meshctl bench sign in its own process (32 in flight, pre-minted tokens,
// pre-generated P-256 CSRs), beside the in-process crypto ceiling (CSR parse and
// verify, certificate, PEM) in the same run, rounds times alternating; medians.
// Each figure comes twice: unconfined (signer, nats-server, load client and
// ceiling share every CPU) and confined (the signer, or the ceiling, alone on one
// CPU with GOMAXPROCS=1; nats-server and the load client on the other: the same
// allotment for both). ratio-wall is CSRs/s over the ceiling's of the same layout;
// ratio-cpu the ceiling's CPU per CSR over the signer process's (from
// /proc/<pid>/stat), the robust one on a shared machine; ratio-cpu-jwt is against
// the ceiling plus the per-request ES256 token verification this path still does.
// MESHAGENT_SIGNER_BASE=<signer binary> adds the same runs against that binary
// (JSON requests: a signer before the compact body), for a side-by-side before and
// after; MESHAGENT_SIGNER_PROFILE=<dir> writes the signer's CPU and allocation
// profiles (profile_bench_test.go). Binaries come from MESHAGENT_BIN (make bench),
// else are built. Run with -benchtime 1x.
func BenchmarkSignRealBinary(b *testing.B) {
	e := newRealEnv(b, false)
	// Pre-minted tokens, one service account each, as a fleet holds them.
	toks := make([]string, realCSRs)
	for i := range toks {
		toks[i] = e.iss.Mint(b, e.iss.ServiceAccount("bench", fmt.Sprintf("w%d", i), time.Now().Add(-time.Second), 2*time.Hour))
	}
	e.writeTokens(b, toks)
	vs := e.variants(b, filepath.Join(e.bin, "signer"), "any", "-subject", "any")
	if base := os.Getenv("MESHAGENT_SIGNER_BASE"); base != "" {
		vs = append(vs, e.variants(b, base, "base-any", "-subject", "any", "-encoding", baseEncoding())...)
	}
	st := e.run(b, vs, true)
	e.profile(b, vs)
	st.report(b, vs)
	b.ReportMetric(st.med(st.jwtCPU), "ceiling-jwt-cpu-µs/CSR")
	b.ReportMetric(st.med(st.of["any"].cpuJWT), "any-ratio-cpu-jwt")
}

// BenchmarkSignRealBinaryBusID measures signing on identity subjects: the real
// signer binary on a secured TCP nats-server, serving the auth callout and run with
// -bus-sign-id; meshctl bench sign connects 32 pods (pod-bound tokens, admitted by
// the callout) and signs on their sign.pod subjects (token verified per request,
// "pod") and on their sign.id subjects (identity from the subject, "id"; also
// confined, as BenchmarkSignRealBinary says), alternating with the in-process
// crypto ceiling, rounds times; medians. id/pod-cpu is the id path's signer CPU per
// CSR over the pod path's. MESHAGENT_SIGNER_BASE adds "base-id" runs against that
// binary (JSON requests unless MESHAGENT_SIGNER_BASE_ENCODING says compact). Run
// with -benchtime 1x.
func BenchmarkSignRealBinaryBusID(b *testing.B) {
	e := newRealEnv(b, true)
	// One pod-bound token per pod connection.
	toks := make([]string, clients)
	for i := range toks {
		sa := e.iss.ServiceAccount("bench", fmt.Sprintf("w%d", i), time.Now().Add(-time.Second), 2*time.Hour)
		toks[i] = e.iss.Mint(b, sa.ForPod(fmt.Sprintf("w%d-0", i)))
	}
	e.writeTokens(b, toks)
	vs := e.variants(b, filepath.Join(e.bin, "signer"), "id", "-subject", "id")
	vs = append(vs, realVariant{label: "pod", s: vs[0].s, args: []string{"-subject", "pod"}})
	if base := os.Getenv("MESHAGENT_SIGNER_BASE"); base != "" {
		vs = append(vs, e.variants(b, base, "base-id", "-subject", "id", "-encoding", baseEncoding())...)
	}
	st := e.run(b, vs, false)
	e.profile(b, vs)
	st.report(b, vs)
	id, pod := st.of["id"], st.of["pod"]
	b.ReportMetric(st.med(id.cpu)/st.med(pod.cpu), "id/pod-cpu")
}

// baseEncoding is how requests to the MESHAGENT_SIGNER_BASE binary are encoded:
// json (a signer from before the compact encoding), unless
// MESHAGENT_SIGNER_BASE_ENCODING says compact.
func baseEncoding() string {
	if e := os.Getenv("MESHAGENT_SIGNER_BASE_ENCODING"); e != "" {
		return e
	}
	return "json"
}

// realVariant is one measured configuration: a signer process and the meshctl
// bench sign flags of its load.
type realVariant struct {
	label string
	s     *signerProc
	args  []string
}

// variants starts bin twice, unconfined (label) and, where the machine allows,
// confined (label-confined), each loaded with args. MESHAGENT_SIGNER_ENV (K=V,
// comma-separated) adds the same pair run with that environment (label-env,
// label-env-confined), side by side: for the runtime's knobs (GOGC, GODEBUG).
func (e *realEnv) variants(b *testing.B, bin, label string, args ...string) []realVariant {
	var vs []realVariant
	envs := [][]string{nil}
	if extra := os.Getenv("MESHAGENT_SIGNER_ENV"); extra != "" {
		envs = append(envs, strings.Split(extra, ","))
	}
	for i, env := range envs {
		l := label
		if i > 0 {
			l += "-env"
		}
		vs = append(vs, realVariant{label: l, s: e.startSigner(b, bin, false, env...), args: args})
		if e.layout.ok() {
			vs = append(vs, realVariant{label: l + "-confined", s: e.startSigner(b, bin, true, env...), args: args})
		}
	}
	return vs
}

// profile takes every variant's profiles when MESHAGENT_SIGNER_PROFILE asks.
func (e *realEnv) profile(b *testing.B, vs []realVariant) {
	for _, v := range vs {
		profileSigner(b, v.s, v.label, func(dur time.Duration) signBench {
			return e.load(b, v.s, append(v.args, "-duration", dur.String())...)
		})
	}
}

// realStats are every round's figures of one variant.
type realStats struct {
	rate, cpu, p50, p99, wall, ratioCPU, cpuJWT, client, nats, writes, reads []float64
}

// realRun is a whole real-binary measurement: the ceilings' figures (unconfined,
// with the token verified, confined) and each variant's, by label.
type realRun struct {
	rate, cpu, jwtCPU, confRate, confCPU []float64
	of                                   map[string]*realStats
}

func (*realRun) med(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	ys := slices.Clone(xs)
	slices.Sort(ys)
	return ys[len(ys)/2]
}

// run measures rounds times: the ceiling in this process (and with the token
// verified, if withJWT), the confined ceiling in a child when the machine allows,
// then every variant; each variant's ratios are against the ceiling of its own
// layout in the same round.
func (e *realEnv) run(b *testing.B, vs []realVariant, withJWT bool) *realRun {
	c := newCeiling(b, pki.ECP256, realCSRs)
	st := &realRun{of: map[string]*realStats{}}
	for range rounds {
		ceil := withSignerGC(func() result { return c.run(b, false) })
		st.rate, st.cpu = append(st.rate, ceil.rate()), append(st.cpu, float64(ceil.cpuPerCSR().Microseconds()))
		var jwt, conf result
		if withJWT {
			jwt = withSignerGC(func() result { return c.run(b, true) })
			st.jwtCPU = append(st.jwtCPU, float64(jwt.cpuPerCSR().Microseconds()))
		}
		if e.layout.ok() {
			conf = e.ceilingConfined(b, pki.ECP256, realCSRs)
			st.confRate, st.confCPU = append(st.confRate, conf.rate()), append(st.confCPU, float64(conf.cpuPerCSR().Microseconds()))
		}
		for _, v := range vs {
			r := e.load(b, v.s, v.args...)
			x := st.of[v.label]
			if x == nil {
				x = &realStats{}
				st.of[v.label] = x
			}
			ref := ceil
			if v.s.confined {
				ref = conf
			}
			x.rate, x.cpu = append(x.rate, r.Rate), append(x.cpu, r.CPUMicro)
			x.client, x.nats = append(x.client, r.ClientCPUMicro), append(x.nats, r.NATSCPUMicro)
			x.writes, x.reads = append(x.writes, r.Writes), append(x.reads, r.Reads)
			x.p50, x.p99 = append(x.p50, float64(r.P50Micro)), append(x.p99, float64(r.P99Micro))
			x.wall = append(x.wall, r.Rate/ref.rate())
			x.ratioCPU = append(x.ratioCPU, float64(ref.cpuPerCSR().Microseconds())/r.CPUMicro)
			if withJWT && !v.s.confined {
				x.cpuJWT = append(x.cpuJWT, float64(jwt.cpuPerCSR().Microseconds())/r.CPUMicro)
			}
		}
	}
	return st
}

// report logs a table of medians and reports each variant's figures as metrics
// named <label>-<figure>.
func (st *realRun) report(b *testing.B, vs []realVariant) {
	var tab strings.Builder
	fmt.Fprintf(&tab, "P-256, %d in flight, n=%d per run, %d rounds, medians:\n", clients, realCSRs, rounds)
	row := func(label string, rate, p50, p99, cpu, rcpu, rwall, client, nats, writes, reads float64) {
		fmt.Fprintf(&tab, "  %-18s %9.0f %9.0f %9.0f %12.0f %10.2f %10.2f %12.0f %10.0f %9.2f %9.2f\n", label, rate, p50, p99, cpu, rcpu, rwall, client, nats, writes, reads)
	}
	fmt.Fprintf(&tab, "  %-18s %9s %9s %9s %12s %10s %10s %12s %10s %9s %9s\n", "", "CSRs/s", "p50 µs", "p99 µs", "CPU µs/CSR", "ratio CPU", "ratio wall", "client µs/CSR", "nats µs/CSR", "writes/CSR", "reads/CSR")
	row("ceiling", st.med(st.rate), 0, 0, st.med(st.cpu), 0, 0, 0, 0, 0, 0)
	b.ReportMetric(st.med(st.rate), "ceiling-CSRs/s")
	b.ReportMetric(st.med(st.cpu), "ceiling-cpu-µs/CSR")
	if len(st.confRate) > 0 {
		row("ceiling-confined", st.med(st.confRate), 0, 0, st.med(st.confCPU), 0, 0, 0, 0, 0, 0)
		b.ReportMetric(st.med(st.confRate), "ceiling-confined-CSRs/s")
		b.ReportMetric(st.med(st.confCPU), "ceiling-confined-cpu-µs/CSR")
	}
	for _, v := range vs {
		x := st.of[v.label]
		row(v.label, st.med(x.rate), st.med(x.p50), st.med(x.p99), st.med(x.cpu), st.med(x.ratioCPU), st.med(x.wall), st.med(x.client), st.med(x.nats), st.med(x.writes), st.med(x.reads))
		b.ReportMetric(st.med(x.rate), v.label+"-CSRs/s")
		b.ReportMetric(st.med(x.cpu), v.label+"-cpu-µs/CSR")
		b.ReportMetric(st.med(x.ratioCPU), v.label+"-ratio-cpu")
		b.ReportMetric(st.med(x.wall), v.label+"-ratio-wall")
		b.ReportMetric(st.med(x.client), v.label+"-client-cpu-µs/CSR")
		b.ReportMetric(st.med(x.nats), v.label+"-nats-cpu-µs/CSR")
		b.ReportMetric(st.med(x.writes), v.label+"-writes/CSR")
		if !v.s.confined {
			b.ReportMetric(st.med(x.p50), v.label+"-p50-µs")
			b.ReportMetric(st.med(x.p99), v.label+"-p99-µs")
		}
	}
	b.ReportMetric(0, "ns/op")
	b.Log(tab.String())
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
