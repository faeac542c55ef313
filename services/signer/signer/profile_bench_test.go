package signer

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/meshagent/meshagent/tests/testkit"
)

// profileDir is where the real-binary benchmarks write the signer process's
// profiles while it serves load (MESHAGENT_SIGNER_PROFILE=dir); empty: none are
// taken and the signer serves no pprof.
func profileDir() string { return os.Getenv("MESHAGENT_SIGNER_PROFILE") }

// profileWindow is how long the profiled load runs; the CPU profile covers its
// middle, after meshctl's warm-up.
const profileWindow = 20 * time.Second

// pprofArgs are the signer flags that serve its profiles on a free loopback
// address (returned), when profiles are asked for.
func pprofArgs(b *testing.B) (args []string, addr string) {
	if profileDir() == "" {
		return nil, ""
	}
	addr = testkit.FreeAddr(b)
	return []string{"-pprof-addr", addr}, addr
}

// profileSigner runs load for profileWindow plus margins and takes, from the
// signer s, a CPU profile of the window and the allocations made during it
// (allocs before and after: go tool pprof -base), written to profileDir() as
// <name>-cpu.pprof, <name>-allocs-0.pprof and <name>-allocs-1.pprof.
func profileSigner(b *testing.B, s *signerProc, name string, load func(dur time.Duration) signBench) {
	dir := profileDir()
	if dir == "" {
		return
	}
	addr, metricsAddr := s.pprofAddr, s.httpAddr
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	get := func(path, file string) error {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		f, err := os.Create(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	issued0 := issuedTotal(metricsAddr)
	var wg sync.WaitGroup
	var perr error
	var windowCSRs float64
	wg.Go(func() {
		// Past meshctl's warm-up (200 requests) before the window opens.
		testkit.EventuallyWithin(b, 30*time.Second, "load past its warm-up", func() bool { return issuedTotal(metricsAddr) >= issued0+400 })
		if perr = get("/debug/pprof/allocs", name+"-allocs-0.pprof"); perr != nil {
			return
		}
		before := issuedTotal(metricsAddr)
		if perr = get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(profileWindow.Seconds())), name+"-cpu.pprof"); perr != nil {
			return
		}
		windowCSRs = issuedTotal(metricsAddr) - before
		perr = get("/debug/pprof/allocs", name+"-allocs-1.pprof")
	})
	r := load(profileWindow + 6*time.Second)
	wg.Wait()
	if perr != nil {
		b.Fatalf("profile %s: %v", name, perr)
	}
	tab, err := cpuBreakdown(filepath.Join(dir, name+"-cpu.pprof"), windowCSRs)
	if err != nil {
		b.Fatalf("profile %s: %v", name, err)
	}
	b.Logf("profiled %s: %.0f CSRs/s, signer CPU %.0fµs/CSR over %d CSRs; %.0f CSRs in the CPU profile's window; profiles in %s\n%s",
		name, r.Rate, r.CPUMicro, r.CSRs, windowCSRs, dir, tab)
}

// issuedTotal is the signer's meshagent_signer_certs_issued_total over every
// transport, read from its /metrics at addr (0 when unreadable).
func issuedTotal(addr string) float64 {
	_, body := testkit.HTTPGet("http://" + addr + "/metrics")
	var n float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "meshagent_signer_certs_issued_total{") {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			n += v
		}
	}
	return n
}

// cpuRows are the rows of the signer's CPU breakdown: each sample of a CPU profile
// counts once, under the first row one of whose functions is on its stack (names
// are matched as substrings of the function names, root first).
var cpuRows = []struct {
	row   string
	funcs []string
}{
	{"GC in the background (mark, sweep, scavenge)", []string{"runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge"}},
	{"GC assists while allocating", []string{"runtime.gcAssistAlloc"}},
	{"profiling itself", []string{"runtime/pprof."}},
	{"CSR parse and signature check", []string{"pki.ParseCSR"}},
	{"certificate: create, sign, Go's self-check, parse", []string{"ca.(*Material).sign"}},
	{"the leaf's PEM", []string{"pki.EncodeCertPEM"}},
	{"token verification (ES256)", []string{"issuer.(*Issuer).authenticate"}},
	{"request decode (envelope, JSON or compact)", []string{"events.Decode[", "events.DecodeSign", "events.decodeEither"}},
	{"reply encode and publish", []string{"natsapi.(*API).respond"}},
	{"cert.issued encode (CloudEvents JSON)", []string{"events.Encode"}},
	{"cert.issued publish and ack", []string{"bus.Publish", "nats.go/jetstream.", "bus.(*AsyncPublisher)"}},
	{"nats.go read loop and dispatch", []string{").readLoop", ").processMsg", ").waitForMsgs"}},
	{"nats.go flusher: socket writes", []string{").flusher"}},
	{"goroutine start and stack growth", []string{"runtime.newstack", "runtime.newproc"}},
	{"scheduler: park, wake, netpoll", []string{"runtime.schedule", "runtime.findRunnable", "runtime.mcall", "runtime.park_m"}},
	{"metrics", []string{"prometheus"}},
	{"logging", []string{"hclog"}},
	{"the rest of the issuer and the NATS API", []string{"issuer.", "natsapi."}},
}

// cpuBreakdown reads a CPU profile and returns its table: each row's µs per CSR
// (csrs signed in the profile's window) and share.
func cpuBreakdown(path string, csrs float64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return "", err
	}
	cpu := len(p.SampleType) - 1 // cpu nanoseconds
	sums := make([]float64, len(cpuRows)+1)
	var total float64
	for _, s := range p.Sample {
		v := float64(s.Value[cpu])
		total += v
		row := len(cpuRows) // other
	rows:
		for i, r := range cpuRows {
			for j := len(s.Location) - 1; j >= 0; j-- {
				for _, l := range s.Location[j].Line {
					for _, name := range r.funcs {
						if l.Function != nil && strings.Contains(l.Function.Name, name) {
							row = i
							break rows
						}
					}
				}
			}
		}
		sums[row] += v
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  %-52s %10s %7s\n", "signer CPU per CSR, by where", "µs/CSR", "share")
	for i, v := range sums {
		name := "other"
		if i < len(cpuRows) {
			name = cpuRows[i].row
		}
		if v > 0 {
			fmt.Fprintf(&b, "  %-52s %10.1f %6.1f%%\n", name, v/1e3/csrs, 100*v/total)
		}
	}
	fmt.Fprintf(&b, "  %-52s %10.1f\n", "total", total/1e3/csrs)
	return b.String(), nil
}
