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
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"golang.org/x/sys/unix"
)

// realEnv is what every signer process of a real-binary benchmark shares: the
// binaries, one token issuer and its JWKS, the CA's key-encryption key and, on a
// secured bus, the bus credentials.
type realEnv struct {
	bin     string // signer and meshctl
	dir     string
	iss     *tokentest.Issuer
	jwks    string
	kek     string
	creds   *policy.Credentials // nil: an open bus
	layout  layout
	tokFile string
}

func newRealEnv(b *testing.B, secured bool) *realEnv {
	e := &realEnv{bin: benchBinaries(b), dir: testkit.ShortDir(b), iss: tokentest.NewIssuer(b, "meshagent-dev"), kek: signertest.KEKFile(b)}
	e.jwks = e.iss.WriteJWKS(b, e.dir)
	e.layout = confinedLayout()
	if secured {
		creds, err := policy.LoadOrGenerate(filepath.Join(e.dir, "secrets"))
		if err != nil {
			b.Fatal(err)
		}
		e.creds = creds
	}
	return e
}

// writeTokens writes one token per line to the env's token file.
func (e *realEnv) writeTokens(b *testing.B, toks []string) {
	e.tokFile = filepath.Join(e.dir, "tokens")
	if err := os.WriteFile(e.tokFile, []byte(strings.Join(toks, "\n")+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
}

// layout is the confined measurement's placement (taskset CPU lists): the signer,
// or the ceiling, alone on one CPU with GOMAXPROCS=1; nats-server (in this
// process) and the load client on the rest. Zero: not available here.
type layout struct{ signer, rest string }

func (l layout) ok() bool { return l.signer != "" }

// confinedLayout puts the signer on the last CPU and everything else on the
// others; it needs taskset and two CPUs.
func confinedLayout() layout {
	n := runtime.NumCPU()
	if _, err := exec.LookPath("taskset"); err != nil || n < 2 {
		return layout{}
	}
	rest := "0"
	if n > 2 {
		rest = fmt.Sprintf("0-%d", n-2)
	}
	return layout{signer: strconv.Itoa(n - 1), rest: rest}
}

// pinSelf sets the CPU affinity of every thread of this process (the embedded
// nats-servers live here) to cpus and returns a function that restores it.
func pinSelf(b *testing.B, cpus string) func() {
	var orig unix.CPUSet
	if err := unix.SchedGetaffinity(0, &orig); err != nil {
		b.Fatal(err)
	}
	var set unix.CPUSet
	for _, part := range strings.Split(cpus, ",") {
		lo, hi, _ := strings.Cut(part, "-")
		from, _ := strconv.Atoi(lo)
		to := from
		if hi != "" {
			to, _ = strconv.Atoi(hi)
		}
		for c := from; c <= to; c++ {
			set.Set(c)
		}
	}
	apply := func(s *unix.CPUSet) {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range tasks {
			if tid, err := strconv.Atoi(t.Name()); err == nil {
				_ = unix.SchedSetaffinity(tid, s) // a thread may have exited meanwhile
			}
		}
	}
	apply(&set)
	return func() { apply(&orig) }
}

// signerProc is one real signer process on its own nats-server (in this process,
// TCP loopback), confined or not.
type signerProc struct {
	url                 string
	pid                 int
	httpAddr, pprofAddr string
	logs                *bytes.Buffer
	confined            bool
}

// startSigner starts bin (a signer binary) on a fresh nats-server: on a secured
// bus it serves the auth callout with -bus-sign-id; confined, it runs alone on the
// layout's signer CPU with GOMAXPROCS=1.
func (e *realEnv) startSigner(b *testing.B, bin string, confined bool, env ...string) *signerProc {
	dir := b.TempDir()
	cfg := embedded.Config{Port: -1, StoreDir: filepath.Join(dir, "nats")}
	if e.creds != nil {
		cfg.Auth = &e.creds.Keys
	}
	ns, err := embedded.Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	s := &signerProc{url: ns.ClientURL(), httpAddr: testkit.FreeAddr(b), logs: &bytes.Buffer{}, confined: confined}
	args := []string{"-instance", "bench-0", "-nats-url", s.url, "-http-addr", s.httpAddr, "-grpc-addr", testkit.FreeAddr(b),
		"-jwks-file", e.jwks, "-ca-kek-file", e.kek, "-log-level", "warn", "-max-early-certs-per-minute", "0"}
	if e.creds != nil {
		args = append(args, "-nats-nkey", e.creds.SeedFile(policy.Signer), "-bus-callout-seed", e.creds.IssuerFile(),
			"-bus-callout-nkey", e.creds.SeedFile(policy.Callout), "-bus-sign-id")
	}
	var pprof []string
	pprof, s.pprofAddr = pprofArgs(b)
	cmd := exec.Command(bin, append(args, pprof...)...)
	cmd.Env = append(os.Environ(), env...)
	if confined {
		cmd = exec.Command("taskset", append([]string{"-c", e.layout.signer, bin}, append(args, pprof...)...)...)
		cmd.Env = append(os.Environ(), append(env, "GOMAXPROCS=1")...)
	}
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s.pid = cmd.Process.Pid // taskset execs the signer: the same pid
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var code int
	var body string
	if !testkit.Poll(30*time.Second, func() bool {
		code, body = testkit.HTTPGet("http://" + s.httpAddr + "/readyz")
		return code == http.StatusOK
	}) {
		b.Fatalf("signer %s (confined %v) not ready after 30s: %d %s\nlog:\n%s", bin, confined, code, body, s.logs.String())
	}
	return s
}

// load runs meshctl bench sign against s (realCSRs P-256 CSRs, clients in flight,
// the env's tokens) with more flags; confined, meshctl and this process's
// nats-server run on the layout's other CPUs meanwhile.
func (e *realEnv) load(b *testing.B, s *signerProc, more ...string) signBench {
	args := append([]string{"-nats-url", s.url, "-tokens", e.tokFile, "-signer-pid", strconv.Itoa(s.pid)}, more...)
	var wrap []string
	if s.confined {
		defer pinSelf(b, e.layout.rest)()
		wrap = []string{"taskset", "-c", e.layout.rest}
	}
	cpu0 := cpuTime()
	w0, r0 := procSyscalls(s.pid)
	r := meshctlBenchSign(b, e.bin, s.logs, wrap, args...)
	// This process does nothing else meanwhile: its CPU is the nats-server's.
	n := float64(r.CSRs + warmupCSRs)
	r.NATSCPUMicro = float64((cpuTime() - cpu0).Microseconds()) / n
	w1, r1 := procSyscalls(s.pid)
	r.Writes, r.Reads = float64(w1-w0)/n, float64(r1-r0)/n
	return r
}

// procSyscalls is how many write and read system calls (every kind: write,
// writev, send...; read, recv...) process pid has made (/proc/<pid>/io), 0 when
// unreadable.
func procSyscalls(pid int) (writes, reads int64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "syscw":
			writes = n
		case "syscr":
			reads = n
		}
	}
	return writes, reads
}

// warmupCSRs is how many requests meshctl bench sign sends before it measures.
const warmupCSRs = 200

// meshctlBenchSign runs meshctl bench sign (realCSRs P-256 CSRs, clients in
// flight, json) with args, under wrap (e.g. taskset) if given, and decodes its
// result; logs is the signer's output, shown when it fails.
func meshctlBenchSign(b *testing.B, bin string, logs *bytes.Buffer, wrap []string, args ...string) signBench {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	argv := append(append(wrap, filepath.Join(bin, "meshctl"), "bench", "sign", "-n", strconv.Itoa(realCSRs),
		"-in-flight", strconv.Itoa(clients), "-warmup", strconv.Itoa(warmupCSRs), "-key-alg", string(pki.ECP256), "-o", "json"), args...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
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

// ceilingChildEnv asks this test binary (TestMain) to run the crypto ceiling once
// and print its result: "<key alg> <CSRs>".
const ceilingChildEnv = "MESHAGENT_BENCH_CEILING_CHILD"

// ceilingConfined runs the crypto ceiling in a child process (this test binary)
// alone on the layout's signer CPU with GOMAXPROCS=1: the same allotment as a
// confined signer.
func (e *realEnv) ceilingConfined(b *testing.B, alg pki.KeyAlg, n int) result {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("taskset", "-c", e.layout.signer, self, "-test.run", "^$")
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1", fmt.Sprintf("%s=%s %d", ceilingChildEnv, alg, n))
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		b.Fatalf("confined ceiling: %v\n%s", err, stderr)
	}
	var c ceilingOut
	if err := json.Unmarshal(bytes.TrimSpace(out), &c); err != nil {
		b.Fatalf("confined ceiling output %q: %v", out, err)
	}
	lat := make([]time.Duration, c.CSRs) // only the count is read: rate and CPU per CSR
	return result{lat: lat, elapsed: time.Duration(c.Seconds * float64(time.Second)), cpu: time.Duration(c.CPUSeconds * float64(time.Second))}
}

// ceilingOut is what the ceiling's child process prints.
type ceilingOut struct {
	CSRs       int     `json:"csrs"`
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"`
}

// signerGCPercent is the GC target the signer binary runs with (its -gogc default,
// or GOGC when set): the ceiling is measured with it too, since the same crypto done
// the fastest way in process would be.
func signerGCPercent() int {
	c, err := config.Load([]string{"-instance", "x", "-ca-kek-file", "x"}, os.Getenv)
	if err != nil {
		return config.DefaultGCPercent
	}
	return c.GCPercent
}

// withSignerGC runs f with this process's GC target at the signer's.
func withSignerGC[T any](f func() T) T {
	defer debug.SetGCPercent(debug.SetGCPercent(signerGCPercent()))
	return f()
}

// runCeilingChild is the child's whole life: build the ceiling's inputs, measure
// once, print the result; the exit code.
func runCeilingChild(spec string) int {
	alg, count, _ := strings.Cut(spec, " ")
	n, err := strconv.Atoi(count)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling child:", err)
		return 2
	}
	c, err := buildCeiling(pki.KeyAlg(alg), n)
	if err == nil {
		var r result
		debug.SetGCPercent(signerGCPercent())
		if r, err = c.measure(false); err == nil {
			err = json.NewEncoder(os.Stdout).Encode(ceilingOut{CSRs: len(r.lat), Seconds: r.elapsed.Seconds(), CPUSeconds: r.cpu.Seconds()})
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling child:", err)
		return 1
	}
	return 0
}
