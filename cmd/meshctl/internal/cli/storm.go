package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
)

// StormBench is what `meshctl bench storm` measured (its -o json form).
type StormBench struct {
	Pods        int `json:"pods"`
	ConnsPerPod int `json:"connections_per_pod"`
	Certified   int `json:"certified"`
	Failed      int `json:"failed"`
	// Wasted is work done for no one: connections admitted by the callout that no
	// client holds, and certificates signed that no pod received.
	Wasted int `json:"wasted"`
	// WastedAdmissions and WastedCerts are Wasted's two parts.
	WastedAdmissions int `json:"wasted_admissions"`
	WastedCerts      int `json:"wasted_certificates"`
	// Repeats are sign requests asked again after their answer was lost, answered
	// with the certificate already recorded for them (no certificate wasted).
	Repeats float64 `json:"repeated_requests"`
	Seconds float64 `json:"seconds"`
	// Admitted and Busy are the callout's admissions and busy refusals in the run.
	Admitted float64 `json:"admitted"`
	Busy     float64 `json:"busy_refusals"`
	// Dropped are connect requests the callout reached after the server gave up
	// on them; CacheHits connections admitted without verifying the token again.
	Dropped   float64 `json:"dropped"`
	CacheHits float64 `json:"token_cache_hits"`
	// ConnectErrors counts the clients' failed connect attempts by error.
	ConnectErrors map[string]int `json:"connect_errors,omitempty"`
	// CPU per pod of the signer and of the nats-server process (the local
	// stack's `meshctl up`, which embeds it), and the nats-server's resident
	// memory per connection held.
	SignerCPUMicroPerPod float64 `json:"signer_cpu_us_per_pod,omitempty"`
	NATSCPUMicroPerPod   float64 `json:"nats_cpu_us_per_pod,omitempty"`
	NATSBytesPerConn     float64 `json:"nats_bytes_per_connection,omitempty"`
	// Rotation is the root rotation after the storm (-rotate), when asked for.
	Rotation *StormRotation `json:"rotation,omitempty"`
}

// StormRotation is a root rotation of the storm's live pods through the real
// signer and rotator: from the signer's answer to the rotate request until every
// pod held a certificate of the new root generation, each pod renewing when the
// rotator's renew command reached it, as sds-edge does.
type StormRotation struct {
	NewKey    bool    `json:"new_key"`
	Pods      int     `json:"pods"`
	Rotated   int     `json:"rotated"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"pods_per_second"`
	// Commands counts the renew commands the pods received (one each when none was
	// repeated); SignerCPUMicroPerPod is the signer's CPU per rotated pod.
	Commands             int     `json:"renew_commands"`
	SignerCPUMicroPerPod float64 `json:"signer_cpu_us_per_pod,omitempty"`
}

// runBenchStorm: -pods simulated pods, each with -conns bus connections made
// with its own pod-bound token file through bus.Connect (the services' client:
// its timeouts and jittered reconnect schedule), all at once; each pod then asks
// for one certificate on its identity subject, as sds-edge does, retrying on the
// shared backoff schedule until -timeout.
func runBenchStorm(ctx context.Context, env Env, args []string) error {
	var dir, ns, sa, output, rotate string
	var pods, conns, signerPID, natsPID int
	var timeout time.Duration
	var bf busFlags
	fs := flagenv.New("bench storm", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	fs.Int(&pods, "pods", "", 1000, "simulated pods, all starting at once")
	fs.Int(&conns, "conns", "", 3, "bus connections per pod: 3 as the three-process pod (sds-edge, xds-relay, launcher), 1 as `meshagent pod`")
	fs.String(&ns, "ns", "", "storm", "namespace of the pods")
	fs.String(&sa, "sa", "", "load", "service account of the pods")
	fs.Duration(&timeout, "timeout", "", 5*time.Minute, "give up on pods not certified by then")
	fs.Int(&signerPID, "signer-pid", "", 0, "pid of a local signer (default: the local stack's)")
	fs.Int(&natsPID, "nats-pid", "", 0, "pid of the local nats-server process (default: the one listening on the stack's NATS port)")
	fs.String(&output, "o", "", "text", "output: text or json")
	fs.String(&rotate, "rotate", "", "none", "after the storm, rotate the root (same-key or new-key) and time the live pods' renewals until each holds a certificate of the new root")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	var errs []error
	if pods < 1 {
		errs = append(errs, errors.New("-pods: at least 1"))
	}
	if conns < 1 || conns > 3 {
		errs = append(errs, errors.New("-conns: 1 to 3"))
	}
	if timeout <= 0 {
		errs = append(errs, errors.New("-timeout: must be positive"))
	}
	if output != "text" && output != "json" {
		errs = append(errs, fmt.Errorf("-o: %q, want text or json", output))
	}
	if rotate != "none" && rotate != "same-key" && rotate != "new-key" {
		errs = append(errs, fmt.Errorf("-rotate: %q, want none, same-key or new-key", rotate))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	st, err := stackfile.Read(dir)
	if err != nil {
		return fmt.Errorf("%w (bench storm mints the pods' tokens with the local stack's dev issuer)", err)
	}
	natsURL := bf.url
	if natsURL == "" {
		natsURL = st.NATSURL
	}
	if bf.tlsCA == "" {
		bf.tlsCA = st.NATSTLSCA
	}
	iss, err := devtoken.Load(filepath.Join(dir, "issuer"))
	if err != nil {
		return fmt.Errorf("dev token issuer: %w", err)
	}
	work, err := os.MkdirTemp("", "meshctl-storm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	sim, err := preparePods(iss, st, work, ns, sa, pods)
	if err != nil {
		return err
	}
	signer := signerCPU(signerPID, "", st)
	metrics := ""
	if st.Signer.HTTP != "" {
		metrics = "http://" + st.Signer.HTTP + "/metrics"
	}
	if natsPID == 0 {
		natsPID = listenerPID(natsURL)
	}
	before, _ := scrape(metrics)
	s0, sErr := signer.read()
	n0, nErr := procCPUSeconds(natsPID)
	rss0, rErr := procRSS(natsPID)

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var certified, failed, held atomic.Int64
	var mu sync.Mutex
	var last latest
	var open []*nats.Conn
	tally := &errTally{counts: map[string]int{}}
	log := hclog.NewInterceptLogger(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Debug})
	log.RegisterSink(tally)
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range sim {
		wg.Go(func() {
			ncs, err := p.connect(ctx, natsURL, bf.tlsCA, conns, log)
			mu.Lock()
			open = append(open, ncs...)
			mu.Unlock()
			held.Add(int64(len(ncs)))
			if err == nil {
				p.conn = ncs[0]
				err = p.certify(ctx, ncs[0])
			}
			if err != nil {
				failed.Add(1)
				return
			}
			certified.Add(1)
			last.mark()
		})
	}
	wg.Wait()
	res := StormBench{Pods: pods, ConnsPerPod: conns, Certified: int(certified.Load()), Failed: int(failed.Load())}
	if l := last.get(); !l.IsZero() {
		res.Seconds = l.Sub(start).Seconds()
	}
	// Read while every connection is still held.
	if s1, err := signer.read(); sErr == nil && err == nil {
		res.SignerCPUMicroPerPod = (s1 - s0) * 1e6 / float64(pods)
	}
	if n1, err := procCPUSeconds(natsPID); natsPID != 0 && nErr == nil && err == nil {
		res.NATSCPUMicroPerPod = (n1 - n0) * 1e6 / float64(pods)
	}
	if rss1, err := procRSS(natsPID); natsPID != 0 && rErr == nil && err == nil && held.Load() > 0 {
		res.NATSBytesPerConn = float64(rss1-rss0) / float64(held.Load())
	}
	if after, err := scrape(metrics); err == nil && before != nil {
		res.Admitted = after.sum("meshagent_signer_bus_callout_admitted_total") - before.sum("meshagent_signer_bus_callout_admitted_total")
		res.Busy = after.sum(`meshagent_signer_bus_callout_refused_total{reason="busy_try_later"}`) - before.sum(`meshagent_signer_bus_callout_refused_total{reason="busy_try_later"}`)
		issued := after.sum("meshagent_signer_certs_issued_total") - before.sum("meshagent_signer_certs_issued_total")
		res.Dropped = after.sum("meshagent_signer_bus_callout_dropped_total") - before.sum("meshagent_signer_bus_callout_dropped_total")
		res.CacheHits = after.sum("meshagent_signer_bus_callout_token_cache_hits_total") - before.sum("meshagent_signer_bus_callout_token_cache_hits_total")
		res.Repeats = after.sum("meshagent_signer_requests_repeated_total") - before.sum("meshagent_signer_requests_repeated_total")
		res.WastedAdmissions = max(0, int(res.Admitted)-int(held.Load()))
		res.WastedCerts = max(0, int(issued)-res.Certified)
		res.Wasted = res.WastedAdmissions + res.WastedCerts
	}
	if rotate != "none" && res.Certified > 0 {
		rctx, cancel := context.WithTimeout(context.Background(), timeout)
		rot, err := rotateStorm(rctx, sim, &bf, st, rotate == "new-key", signer)
		cancel()
		if err != nil {
			closeAll(open)
			return err
		}
		res.Rotation = rot
	}
	closeAll(open)
	res.ConnectErrors = tally.snapshot()
	if output == "json" {
		return json.NewEncoder(env.Stdout).Encode(res)
	}
	printStorm(env.Stdout, res)
	return nil
}

func printStorm(w io.Writer, r StormBench) {
	fmt.Fprintf(w, "pods=%d certified=%d failed=%d wasted=%d in %.2f s\n", r.Pods, r.Certified, r.Failed, r.Wasted, r.Seconds)
	fmt.Fprintf(w, "connections %d per pod, %.0f admitted by the callout (%.0f with a token checked for another connection), %.0f refused as busy (retried), %.0f dropped (the server had given up)\n", r.ConnsPerPod, r.Admitted, r.CacheHits, r.Busy, r.Dropped)
	fmt.Fprintf(w, "wasted      %d admissions no client holds, %d certificates no pod received (%.0f requests repeated after a lost answer, given the certificate recorded for them)\n", r.WastedAdmissions, r.WastedCerts, r.Repeats)
	for e, n := range r.ConnectErrors {
		fmt.Fprintf(w, "retried     %d connects after: %s\n", n, e)
	}
	fmt.Fprintf(w, "signer      %.0f µs CPU per pod\n", r.SignerCPUMicroPerPod)
	fmt.Fprintf(w, "nats-server %.0f µs CPU per pod, %.1f KiB per connection\n", r.NATSCPUMicroPerPod, r.NATSBytesPerConn/1024)
	if ro := r.Rotation; ro != nil {
		key := "same key"
		if ro.NewKey {
			key = "new key"
		}
		fmt.Fprintf(w, "rotation    root (%s): %d of %d pods certified under the new root in %.2f s (%.0f pods/s), %d renew commands, signer %.0f µs CPU per pod\n",
			key, ro.Rotated, ro.Pods, ro.Seconds, ro.PerSecond, ro.Commands, ro.SignerCPUMicroPerPod)
	}
}

// latest is the latest of the times marked, safe for concurrent use.
type latest struct {
	mu sync.Mutex
	t  time.Time
}

// mark records now.
func (l *latest) mark() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.After(l.t) {
		l.t = now
	}
}

// get is the latest time marked (zero: none).
func (l *latest) get() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t
}

// simPod is one simulated pod: its token file, identity subject and CSR.
type simPod struct {
	pod     events.PodRef
	token   string
	file    string
	subject string
	csr     string
	// conn is the connection the pod asks for certificates on; generation is the
	// root generation of its latest certificate.
	conn       *nats.Conn
	generation atomic.Uint64
}

func preparePods(iss *devtoken.Issuer, st *stackfile.Stack, dir, ns, sa string, n int) ([]*simPod, error) {
	now := time.Now()
	pods := make([]*simPod, n)
	for i := range pods {
		p := &simPod{pod: events.PodRef{Namespace: ns, Name: fmt.Sprintf("storm-%d", i)}}
		var err error
		if p.token, err = iss.MintForPod(ns, sa, p.pod.Name, st.TokenIssuer.Audience, time.Hour, now); err != nil {
			return nil, err
		}
		p.file = filepath.Join(dir, p.pod.Name)
		if err := os.WriteFile(p.file, []byte(p.token), 0o600); err != nil {
			return nil, err
		}
		if p.subject, err = events.IdentitySignSubject(p.pod, sa); err != nil {
			return nil, err
		}
		key, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return nil, err
		}
		csr, err := pki.NewCSR(key, "spiffe://storm.invalid/ns/"+ns+"/sa/"+sa)
		if err != nil {
			return nil, err
		}
		p.csr = string(csr)
		pods[i] = p
	}
	return pods, nil
}

// connect opens the pod's n connections at once, as its processes do.
func (p *simPod) connect(ctx context.Context, natsURL, tlsCA string, n int, log hclog.Logger) ([]*nats.Conn, error) {
	ncs := make([]*nats.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cfg := bus.Config{URL: natsURL, TokenFile: p.file, Name: fmt.Sprintf("storm/%s/%d", p.pod, i), TLS: bus.TLSConfig{CAFile: tlsCA}}
			cfg.AsPod(p.pod, p.file)
			cfg.ConnectWait = time.Until(deadlineOf(ctx))
			ncs[i], errs[i] = bus.Connect(ctx, cfg, log)
		})
	}
	wg.Wait()
	var got []*nats.Conn
	for _, nc := range ncs {
		if nc != nil {
			got = append(got, nc)
		}
	}
	return got, errors.Join(errs...)
}

func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Minute)
}

// certify asks for the pod's certificate on its identity subject until answered,
// and keeps the root generation it was signed under.
func (p *simPod) certify(ctx context.Context, nc *nats.Conn) error {
	retry := bus.Reconnect.Start()
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		// The deadline travels with the request, as sds-edge sends it: the signer
		// signs nothing for a request whose pod has stopped waiting.
		deadline, _ := rctx.Deadline()
		rep, err := signRequest(rctx, nc, p.subject, events.SignRequest{CSR: p.csr, Token: p.token, KeyAlgorithm: string(pki.ECP256), Deadline: deadline}, "sign")
		cancel()
		if err == nil && rep.Error == nil {
			p.generation.Store(rep.Generation)
			return nil
		}
		if err == nil {
			err = rep.Error
		}
		if !backoff.Wait(ctx, clock.Real{}, retry.Next()) {
			return err
		}
	}
}

// metricPage is a Prometheus text page's samples by series.
type metricPage map[string]float64

func (m metricPage) sum(prefix string) float64 {
	var s float64
	for k, v := range m {
		if k == prefix || !strings.Contains(prefix, "{") && strings.HasPrefix(k, prefix+"{") {
			s += v
		}
	}
	return s
}

func scrape(u string) (metricPage, error) {
	if u == "" {
		return nil, errors.New("no metrics URL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	page := metricPage{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			page[line[:i]] = v
		}
	}
	return page, sc.Err()
}

// procRSS is a process's resident memory in bytes (/proc/<pid>/status VmRSS).
func procRSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// listenerPID finds the local process listening on natsURL's port (the stack's
// `meshctl up`, which embeds nats-server), or 0.
func listenerPID(natsURL string) int {
	u, err := url.Parse(natsURL)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fl := strings.Fields(line)
			if len(fl) < 10 || fl[3] != "0A" { // LISTEN
				continue
			}
			i := strings.LastIndexByte(fl[1], ':')
			if p, err := strconv.ParseInt(fl[1][i+1:], 16, 32); err == nil && int(p) == port {
				inodes["socket:["+fl[9]+"]"] = true
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range procs {
		if target, err := os.Readlink(fd); err == nil && inodes[target] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

// addrs are the socket addresses in an error, left out of its kind.
var addrs = regexp.MustCompile(`[0-9a-fA-F.:\[\]]+:[0-9]+(->[0-9a-fA-F.:\[\]]+:[0-9]+)?`)

// paths are the file names in errors (each simulated pod's token file): the tally
// counts an error once whatever pod it came from ("too many open files" in a
// 10,000-pod storm otherwise printed a line per pod).
var paths = regexp.MustCompile(`\s/[^\s:]+`)

// errTally counts the errors bus.Connect logs for its failed attempts.
type errTally struct {
	mu     sync.Mutex
	counts map[string]int
}

func (t *errTally) Accept(_ string, _ hclog.Level, _ string, args ...any) {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "error" {
			t.mu.Lock()
			t.counts[paths.ReplaceAllString(addrs.ReplaceAllString(fmt.Sprint(args[i+1]), "<addr>"), " <file>")]++
			t.mu.Unlock()
		}
	}
}

func (t *errTally) snapshot() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.counts))
	for k, v := range t.counts {
		out[k] = v
	}
	return out
}
