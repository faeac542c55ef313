package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/nats-io/nats.go"
)

// Root rotations a storm may end with (StormConfig.Rotate).
const (
	RotateNone    = "none"
	RotateSameKey = "same-key"
	RotateNewKey  = "new-key"
)

// Layout is the fleet a storm simulates: how many pods, and how many bus
// connections each holds. preparePods makes one simulated pod per pod of it.
type Layout struct {
	Pods int
	// ConnsPerPod is 3 as the three-process pod (sds-edge, xds-relay,
	// launcher), 1 as `meshagent pod`.
	ConnsPerPod int
}

// StormConfig is one `meshctl bench storm` run.
type StormConfig struct {
	// Stack is the local stack; Issuer, its dev issuer, mints the pods' tokens.
	Stack  *stackfile.Stack
	Issuer *devtoken.Issuer
	Layout Layout
	// Namespace and ServiceAccount are the pods'.
	Namespace, ServiceAccount string
	// Timeout bounds the storm, and then the rotation.
	Timeout time.Duration
	// NATSURL and TLSCA are the bus the pods connect to.
	NATSURL, TLSCA string
	// SignerPID and NATSPID say whose CPU is read (default: the local stack's
	// signer, and the process listening on NATSURL's port).
	SignerPID, NATSPID int
	// Rotate is RotateNone, or the root rotation after the storm, asked for on
	// the connection Admin makes.
	Rotate string
	Admin  func(context.Context) (*nats.Conn, error)
}

// Validate reports every bad value at once, naming its flag.
func (c StormConfig) Validate() error {
	var errs []error
	if c.Layout.Pods < 1 {
		errs = append(errs, errors.New("-pods: at least 1"))
	}
	if c.Layout.ConnsPerPod < 1 || c.Layout.ConnsPerPod > 3 {
		errs = append(errs, errors.New("-conns: 1 to 3"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, errors.New("-timeout: must be positive"))
	}
	if c.Rotate != RotateNone && c.Rotate != RotateSameKey && c.Rotate != RotateNewKey {
		errs = append(errs, fmt.Errorf("-rotate: %q, want none, same-key or new-key", c.Rotate))
	}
	return errors.Join(errs...)
}

// StormResult is what `meshctl bench storm` measured (its -o json form).
type StormResult struct {
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
	Rotation *Rotation `json:"rotation,omitempty"`
}

// WriteText prints r for a person: first `pods=N certified=C failed=F wasted=W
// in S s`, then the connections, the waste, the CPU and the rotation.
func (r StormResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "pods=%d certified=%d failed=%d wasted=%d in %.2f s\n", r.Pods, r.Certified, r.Failed, r.Wasted, r.Seconds)
	fmt.Fprintf(w, "connections %d per pod, %.0f admitted by the callout (%.0f with a token checked for another connection), %.0f refused as busy (retried), %.0f dropped (the server had given up)\n", r.ConnsPerPod, r.Admitted, r.CacheHits, r.Busy, r.Dropped)
	fmt.Fprintf(w, "wasted      %d admissions no client holds, %d certificates no pod received (%.0f requests repeated after a lost answer, given the certificate recorded for them)\n", r.WastedAdmissions, r.WastedCerts, r.Repeats)
	for e, n := range r.ConnectErrors {
		fmt.Fprintf(w, "retried     %d connects after: %s\n", n, e)
	}
	fmt.Fprintf(w, "signer      %.0f µs CPU per pod\n", r.SignerCPUMicroPerPod)
	fmt.Fprintf(w, "nats-server %.0f µs CPU per pod, %.1f KiB per connection\n", r.NATSCPUMicroPerPod, r.NATSBytesPerConn/1024)
	if r.Rotation != nil {
		r.Rotation.writeText(w)
	}
}

// Storm starts the layout's simulated pods all at once, each with its
// connections made with its own pod-bound token file through bus.Connect (the
// services' client: its timeouts and jittered reconnect schedule); each pod then
// asks for one certificate on its identity subject, as sds-edge does, retrying
// on the shared backoff schedule until cfg.Timeout. With cfg.Rotate the root is
// rotated after, through the live pods.
func Storm(ctx context.Context, cfg StormConfig) (StormResult, error) {
	work, err := os.MkdirTemp("", "meshctl-storm-")
	if err != nil {
		return StormResult{}, err
	}
	defer os.RemoveAll(work)
	sim, err := preparePods(cfg, work)
	if err != nil {
		return StormResult{}, err
	}
	m := startMeter(cfg)
	run := runStorm(ctx, cfg, sim)
	res := StormResult{Pods: cfg.Layout.Pods, ConnsPerPod: cfg.Layout.ConnsPerPod, Certified: run.certified, Failed: run.failed, Seconds: run.seconds}
	m.finish(&res, run.held) // while every connection is still held
	if cfg.Rotate != RotateNone && res.Certified > 0 {
		rctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		rot, err := rotateStorm(rctx, sim, cfg.Admin, cfg.Rotate == RotateNewKey, m.signer)
		cancel()
		if err != nil {
			closeAll(run.open)
			return StormResult{}, err
		}
		res.Rotation = rot
	}
	closeAll(run.open)
	res.ConnectErrors = run.tally.snapshot()
	return res, nil
}

// stormRun is how a storm went: the pods certified and failed, the connections
// held (open), the time to the last certificate, the connect errors.
type stormRun struct {
	certified, failed int
	held              int64
	seconds           float64
	open              []*nats.Conn
	tally             *errTally
}

// runStorm starts every pod at once and waits until each is certified or has
// failed (by cfg.Timeout).
func runStorm(ctx context.Context, cfg StormConfig, sim []*simPod) stormRun {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	var certified, failed, held atomic.Int64
	var mu sync.Mutex
	var last latest
	run := stormRun{tally: &errTally{counts: map[string]int{}}}
	log := hclog.NewInterceptLogger(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Debug})
	log.RegisterSink(run.tally)
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range sim {
		wg.Go(func() {
			ncs, err := p.connect(ctx, cfg.NATSURL, cfg.TLSCA, cfg.Layout.ConnsPerPod, log)
			mu.Lock()
			run.open = append(run.open, ncs...)
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
	run.certified, run.failed, run.held = int(certified.Load()), int(failed.Load()), held.Load()
	run.seconds = last.since(start)
	return run
}

// stormMeter reads the signer's and nats-server's CPU, nats-server's memory and
// the signer's metrics before a storm, and fills in a result from how they grew.
type stormMeter struct {
	signer  cpuReader
	metrics string
	natsPID int
	before  metricPage
	s0, n0  float64
	rss0    int64
	sErr    error
	nErr    error
	rErr    error
}

func startMeter(cfg StormConfig) *stormMeter {
	m := &stormMeter{signer: signerCPU(cfg.SignerPID, "", cfg.Stack), metrics: signerMetrics(cfg.Stack), natsPID: cfg.NATSPID}
	if m.natsPID == 0 {
		m.natsPID = listenerPID(cfg.NATSURL)
	}
	m.before, _ = scrape(m.metrics)
	m.s0, m.sErr = m.signer.read()
	m.n0, m.nErr = procCPUSeconds(m.natsPID)
	m.rss0, m.rErr = procRSS(m.natsPID)
	return m
}

// finish fills in res's CPU, memory and callout figures; held is how many
// connections the pods hold.
func (m *stormMeter) finish(res *StormResult, held int64) {
	pods := float64(res.Pods)
	if s1, err := m.signer.read(); m.sErr == nil && err == nil {
		res.SignerCPUMicroPerPod = (s1 - m.s0) * 1e6 / pods
	}
	if n1, err := procCPUSeconds(m.natsPID); m.natsPID != 0 && m.nErr == nil && err == nil {
		res.NATSCPUMicroPerPod = (n1 - m.n0) * 1e6 / pods
	}
	if rss1, err := procRSS(m.natsPID); m.natsPID != 0 && m.rErr == nil && err == nil && held > 0 {
		res.NATSBytesPerConn = float64(rss1-m.rss0) / float64(held)
	}
	after, err := scrape(m.metrics)
	if err != nil || m.before == nil {
		return
	}
	res.Admitted = after.delta(m.before, "meshagent_signer_bus_callout_admitted_total")
	res.Busy = after.delta(m.before, `meshagent_signer_bus_callout_refused_total{reason="busy_try_later"}`)
	issued := after.delta(m.before, "meshagent_signer_certs_issued_total")
	res.Dropped = after.delta(m.before, "meshagent_signer_bus_callout_dropped_total")
	res.CacheHits = after.delta(m.before, "meshagent_signer_bus_callout_token_cache_hits_total")
	res.Repeats = after.delta(m.before, "meshagent_signer_requests_repeated_total")
	res.WastedAdmissions = max(0, int(res.Admitted)-int(held))
	res.WastedCerts = max(0, int(issued)-res.Certified)
	res.Wasted = res.WastedAdmissions + res.WastedCerts
}
