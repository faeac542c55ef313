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

	"github.com/meshagent/meshagent/pkg/testkit"
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
	b.Logf("profiled %s: %.0f CSRs/s, signer CPU %.0fµs/CSR over %d CSRs; %.0f CSRs in the CPU profile's window; profiles in %s", name, r.Rate, r.CPUMicro, r.CSRs, windowCSRs, dir)
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
