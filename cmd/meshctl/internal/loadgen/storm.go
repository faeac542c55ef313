package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
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

// Layout is the fleet a storm simulates: how many pods, how many bus
// connections each holds, and over how many nodes they are spread.
type Layout struct {
	Pods int `json:"pods"`
	// ConnsPerPod is 1 as `meshagent pod`, 3 as the three-process pod
	// (sds-edge, xds-relay, launcher).
	ConnsPerPod int `json:"connections_per_pod"`
	// Nodes is how many node agents (the node tier) the pods are spread over,
	// round robin; 0: every pod connects to the hub itself.
	Nodes int `json:"nodes"`
}

// MaxInProcess is how many connections meshctl's own process holds at most
// (StormConfig.PodsPerWorker unset): this machine allows a process 20,000 open
// files. A larger storm runs in workers of DefaultPodsPerWorker connections
// each, leaving room for what a storm opens besides its connections: a
// retrying pod's next socket while its last one closes, its token file.
// Measured: 100,000 pods over 7 workers of 14,286 ran out of files in every
// worker once the node agents fell behind and pods reconnected.
const (
	MaxInProcess         = 15000
	DefaultPodsPerWorker = 10000
)

// StormConfig is one `meshctl bench storm` run.
type StormConfig struct {
	// Stack is the local stack; IssuerDir holds its dev issuer, which mints the
	// pods' and the node agents' tokens.
	Stack     *stackfile.Stack
	IssuerDir string
	Layout    Layout
	// Namespace and ServiceAccount are the pods'.
	Namespace, ServiceAccount string
	// Timeout bounds the storm, and then the rotation.
	Timeout time.Duration
	// NATSURL and TLSCA are the hub the pods connect to without a node tier.
	NATSURL, TLSCA string
	// BinDir is where the node-agent binary is (empty: beside meshctl, bin/, PATH).
	BinDir string
	// PodsPerWorker bounds the connections one process holds (0: up to
	// MaxInProcess in meshctl's own, else DefaultPodsPerWorker per worker); a
	// larger storm runs in worker processes, WorkerCommand (default: this
	// executable's `bench storm-worker`), each taking whole nodes.
	PodsPerWorker int
	WorkerCommand []string
	// SignerPID and NATSPID say whose CPU is read (default: the local stack's
	// signer, and the process listening on NATSURL's port).
	SignerPID, NATSPID int
	// Nice is the niceness the storm's node agents and worker processes run at
	// (0: as meshctl): in a fleet they are other machines, and on one machine they
	// must not take the cores from the hub and the signer that they stand for.
	// Measured: at 100,000 pods over 100 nodes, 110 busy processes at the same
	// priority left the hub and signer a sliver of the CPU; the leaves dropped and
	// JetStream timed out (docs/scale.md, "Admission inside the leaf server").
	Nice int
	// Procs is GOMAXPROCS of the simulated machines — the node agents, the worker
	// processes, and meshctl's own load while it runs the pods (0: Go's default,
	// every core). Each stands for a machine of its own; fifty runtimes that each
	// think they own both cores of this one keep their schedulers spinning for work
	// on cores the others need. Measured side by side at 10,000 pods over 50 nodes
	// (docs/scale.md): with 1, the node agents spent 26 % and the load client 30 %
	// less CPU per pod in alternating pairs; a later single run did not show it.
	Procs int
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
	if c.Layout.Nodes < 0 {
		errs = append(errs, errors.New("-nodes: 0 (no node tier) or more"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, errors.New("-timeout: must be positive"))
	}
	if c.Rotate != RotateNone && c.Rotate != RotateSameKey && c.Rotate != RotateNewKey {
		errs = append(errs, fmt.Errorf("-rotate: %q, want none, same-key or new-key", c.Rotate))
	}
	if c.Procs < 0 {
		errs = append(errs, fmt.Errorf("-sim-procs: %d, want 0 or more", c.Procs))
	}
	if c.Nice < 0 || c.Nice > 19 {
		errs = append(errs, fmt.Errorf("-nice: %d, want 0 to 19", c.Nice))
	}
	if c.PodsPerWorker < 0 {
		errs = append(errs, errors.New("-pods-per-worker: 0 (the default) or more"))
	}
	if w := c.workers(); w > 1 && c.Rotate != RotateNone {
		errs = append(errs, fmt.Errorf("-rotate: follows the pods in meshctl's own process, up to %d connections (this storm needs %d workers)", MaxInProcess, w))
	}
	if w := c.workers(); w > 1 && c.Layout.Nodes > 0 && c.Layout.Nodes < w {
		errs = append(errs, fmt.Errorf("-nodes: a worker takes whole nodes; %d pods need %d workers, so at least %d nodes", c.Layout.Pods, w, w))
	}
	return errors.Join(errs...)
}

func (c StormConfig) podsPerWorker() int {
	if c.PodsPerWorker > 0 {
		return c.PodsPerWorker
	}
	return DefaultPodsPerWorker
}

// workers is how many worker processes the storm needs (1: none, meshctl's own).
func (c StormConfig) workers() int {
	conns := c.Layout.Pods * max(1, c.Layout.ConnsPerPod)
	if c.PodsPerWorker == 0 && conns <= MaxInProcess {
		return 1
	}
	per := max(1, c.podsPerWorker()/max(1, c.Layout.ConnsPerPod))
	return max(1, (c.Layout.Pods+per-1)/per)
}

// job is the whole storm as one process runs it.
func (c StormConfig) job() job {
	return job{Namespace: c.Namespace, ServiceAccount: c.ServiceAccount, Audience: c.Stack.TokenIssuer.Audience,
		IssuerDir: c.IssuerDir, Layout: c.Layout, NATSURL: c.NATSURL, TLSCA: c.TLSCA, Timeout: c.Timeout}
}

// StormResult is what `meshctl bench storm` measured (its -o json form).
type StormResult struct {
	Pods        int `json:"pods"`
	ConnsPerPod int `json:"connections_per_pod"`
	Nodes       int `json:"nodes"`
	Workers     int `json:"workers,omitempty"`
	Certified   int `json:"certified"`
	Failed      int `json:"failed"`
	// Wasted is work done for no one: connections admitted (by the hub's
	// callout or a node agent's) beyond one per connection held, and
	// certificates signed that no pod received. WastedUnknown: a metric it
	// needs could not be read (Unread says which), and Wasted means nothing.
	Wasted        int  `json:"wasted"`
	WastedUnknown bool `json:"wasted_unknown,omitempty"`
	// WastedAdmissions and WastedCerts are Wasted's two parts.
	WastedAdmissions int `json:"wasted_admissions"`
	WastedCerts      int `json:"wasted_certificates"`
	// CertifiedBy are the seconds from the storm's start by which half, nine
	// tenths and 99 in 100 of the pods were certified: how the wave went, beside
	// Seconds (all of them).
	CertifiedBy [3]float64 `json:"certified_by_p50_p90_p99"`
	// ConnectedBy is the same for the pods' connections (admitted by the hub or
	// their node): what part of the wave was the connecting.
	ConnectedBy [3]float64 `json:"connected_by_p50_p90_p99"`
	// TurnedAway are sign requests the signer answered busy, each with its slot to
	// come back at (its waiting room), instead of queueing them.
	TurnedAway float64 `json:"sign_turned_away"`
	// Repeats are sign requests asked again after their answer was lost, answered
	// with the certificate already recorded for them (no certificate wasted).
	Repeats float64 `json:"repeated_requests"`
	Seconds float64 `json:"seconds"`
	// HubConns is the hub's client plus leaf connections at the storm's peak
	// (read from its /varz while the storm ran), HubConnsBefore before the
	// storm (the node tier already up) and HubConnsEnd at its end.
	HubConns       int `json:"hub_conns"`
	HubConnsBefore int `json:"hub_conns_before"`
	HubConnsEnd    int `json:"hub_conns_end"`
	// HubSamples is how often /varz was read; HubSamplesMissed how many of
	// those reads (between the first and the last, which must succeed) failed.
	HubSamples       int `json:"hub_samples"`
	HubSamplesMissed int `json:"hub_samples_missed,omitempty"`
	// Admitted and Busy are the hub callout's admissions and busy refusals in
	// the run; NodeAdmitted the node agents' admissions.
	Admitted     float64 `json:"admitted"`
	Busy         float64 `json:"busy_refusals"`
	NodeAdmitted float64 `json:"node_admitted"`
	// Dropped are connect requests the callout reached after the server gave up
	// on them; CacheHits connections admitted without verifying the token again.
	Dropped   float64 `json:"dropped"`
	CacheHits float64 `json:"token_cache_hits"`
	// ConnectErrors counts the clients' failed connect attempts by error.
	ConnectErrors map[string]int `json:"connect_errors,omitempty"`
	// CPU per pod of each process: the signer, the hub's nats-server (the local
	// stack's `meshctl up`, which embeds it), the node agents together, and the
	// load client (meshctl itself, or its workers together); and the hub
	// nats-server's resident memory per connection it held.
	SignerCPUMicroPerPod float64 `json:"signer_cpu_us_per_pod,omitempty"`
	NATSCPUMicroPerPod   float64 `json:"nats_cpu_us_per_pod,omitempty"`
	NodesCPUMicroPerPod  float64 `json:"node_agents_cpu_us_per_pod,omitempty"`
	ClientCPUMicroPerPod float64 `json:"client_cpu_us_per_pod,omitempty"`
	NATSBytesPerConn     float64 `json:"nats_bytes_per_connection,omitempty"`
	// Unread lists what could not be read; a storm with any is not a measurement.
	Unread []string `json:"unread,omitempty"`
	// Rotation is the root rotation after the storm (-rotate), when asked for.
	Rotation *Rotation `json:"rotation,omitempty"`
}

// ErrUnread is the error of a storm that could not read what it measures.
var ErrUnread = errors.New("bench storm: a metric could not be read")

// Err is ErrUnread, naming what, when r could not read a metric.
func (r StormResult) Err() error {
	if len(r.Unread) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnread, strings.Join(r.Unread, "; "))
}

// WriteText prints r for a person: first `pods=N certified=C failed=F wasted=W
// in S s hub_conns=H`, then the layout, the connections, the waste, the CPU
// and the rotation.
func (r StormResult) WriteText(w io.Writer) {
	wasted := strconv.Itoa(r.Wasted)
	if r.WastedUnknown {
		wasted = "unknown"
	}
	fmt.Fprintf(w, "pods=%d certified=%d failed=%d wasted=%s in %.2f s hub_conns=%d\n", r.Pods, r.Certified, r.Failed, wasted, r.Seconds, r.HubConns)
	fmt.Fprintf(w, "layout      %d connections per pod, %d nodes, %d load processes\n", r.ConnsPerPod, r.Nodes, max(1, r.Workers))
	fmt.Fprintf(w, "hub         %d connections (clients and leaf nodes) at the peak, %d before, %d at the end (%d samples of /varz, %d missed)\n", r.HubConns, r.HubConnsBefore, r.HubConnsEnd, r.HubSamples, r.HubSamplesMissed)
	fmt.Fprintf(w, "admissions  %.0f by the hub's callout (%.0f with a token checked for another connection), %.0f refused as busy (retried), %.0f dropped (the server had given up); %.0f by node agents\n", r.Admitted, r.CacheHits, r.Busy, r.Dropped, r.NodeAdmitted)
	if r.WastedUnknown {
		fmt.Fprintf(w, "wasted      unknown\n")
	} else {
		fmt.Fprintf(w, "wasted      %d admissions no client holds, %d certificates no pod received (%.0f requests repeated after a lost answer, given the certificate recorded for them)\n", r.WastedAdmissions, r.WastedCerts, r.Repeats)
	}
	if r.Certified > 0 {
		fmt.Fprintf(w, "connected   half by %.2f s, 90%% by %.2f s, 99%% by %.2f s\n", r.ConnectedBy[0], r.ConnectedBy[1], r.ConnectedBy[2])
		fmt.Fprintf(w, "certified   half by %.2f s, 90%% by %.2f s, 99%% by %.2f s; %.0f sign requests turned away busy with a slot to come back at\n",
			r.CertifiedBy[0], r.CertifiedBy[1], r.CertifiedBy[2], r.TurnedAway)
	}
	for e, n := range r.ConnectErrors {
		if why, ok := strings.CutPrefix(e, failedPrefix); ok {
			fmt.Fprintf(w, "failed      %d pods: %s\n", n, why)
			continue
		}
		fmt.Fprintf(w, "retried     %d connects after: %s\n", n, e)
	}
	fmt.Fprintf(w, "cpu per pod signer %.0f µs, hub nats-server %.0f µs, node agents %.0f µs (servers %.0f µs); load client %.0f µs\n",
		r.SignerCPUMicroPerPod, r.NATSCPUMicroPerPod, r.NodesCPUMicroPerPod, r.SignerCPUMicroPerPod+r.NATSCPUMicroPerPod+r.NodesCPUMicroPerPod, r.ClientCPUMicroPerPod)
	if r.NATSBytesPerConn > 0 {
		fmt.Fprintf(w, "nats-server %.1f KiB per connection\n", r.NATSBytesPerConn/1024)
	}
	for _, u := range r.Unread {
		fmt.Fprintf(w, "unread      %s\n", u)
	}
	if r.Rotation != nil {
		r.Rotation.writeText(w)
	}
}

// Storm starts the layout's simulated pods all at once, each with its own key,
// CSR and pod-bound token (node-bound on the node tier), its connections made
// through bus.Connect (the services' client: its timeouts and jittered
// reconnect schedule) to its node's agent, or to the hub; each pod then asks
// for one certificate on its sign subject, as sds-edge does, retrying on the
// shared backoff schedule until cfg.Timeout. With Layout.Nodes the storm first
// starts that many real node agents against the stack's leaf listener; past
// PodsPerWorker pods it runs them in worker processes. With cfg.Rotate the
// root is rotated after, through the live pods.
func Storm(ctx context.Context, cfg StormConfig) (StormResult, error) {
	work, err := os.MkdirTemp("", "meshctl-storm-")
	if err != nil {
		return StormResult{}, err
	}
	defer os.RemoveAll(work)
	iss, err := devtoken.Load(cfg.IssuerDir)
	if err != nil {
		return StormResult{}, fmt.Errorf("dev token issuer: %w", err)
	}
	j := cfg.job()
	var tier *nodeTier
	if cfg.Layout.Nodes > 0 {
		if tier, err = startNodeTier(ctx, cfg, iss, work); err != nil {
			return StormResult{}, err
		}
		defer tier.stop()
		j.Nodes = tier.nodes
	}
	if w := cfg.workers(); w > 1 {
		return stormInWorkers(ctx, cfg, j, w, tier, work)
	}
	sim, err := preparePods(j, iss, work)
	if err != nil {
		return StormResult{}, err
	}
	m := startMeter(cfg, tier, []int{os.Getpid()})
	if cfg.Procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(cfg.Procs))
	}
	run := runStorm(ctx, j, sim)
	res := cfg.result(run, 1)
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
	return res, nil
}

// result is the storm's result before the meter's figures.
func (c StormConfig) result(run stormRun, workers int) StormResult {
	return StormResult{Pods: c.Layout.Pods, ConnsPerPod: c.Layout.ConnsPerPod, Nodes: c.Layout.Nodes, Workers: workers,
		Certified: run.certified, Failed: run.failed, Seconds: run.seconds, ConnectErrors: run.tally.snapshot(),
		CertifiedBy: quantiles(run.start, run.times), ConnectedBy: quantiles(run.start, run.connTimes)}
}

// quantiles are the seconds from start to the 50th, 90th and 99th of times
// (Unix milliseconds).
func quantiles(start time.Time, times []int64) [3]float64 {
	var q [3]float64
	if len(times) == 0 {
		return q
	}
	slices.Sort(times)
	for i, f := range []float64{0.5, 0.9, 0.99} {
		at := times[min(len(times)-1, int(f*float64(len(times))))]
		q[i] = float64(at-start.UnixMilli()) / 1000
	}
	return q
}

// stormRun is how a storm went: the pods certified and failed, the connections
// held (open), the time to the last certificate, the connect errors.
type stormRun struct {
	certified, failed int
	held              int64
	seconds           float64
	last              time.Time // the last certificate's (zero: none)
	start             time.Time
	times             []int64 // each certificate's, Unix milliseconds
	connTimes         []int64 // each pod's connection's
	open              []*nats.Conn
	tally             *errTally
}

// runStorm starts every pod at once and waits until each is certified or has
// failed (by j.Timeout).
func runStorm(ctx context.Context, j job, sim []*simPod) stormRun {
	ctx, cancel := context.WithTimeout(ctx, j.Timeout)
	defer cancel()
	var certified, failed, held atomic.Int64
	var mu sync.Mutex
	var last, connected latest
	run := stormRun{tally: &errTally{counts: map[string]int{}}}
	log := hclog.NewInterceptLogger(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Debug})
	log.RegisterSink(run.tally)
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range sim {
		wg.Go(func() {
			ncs, err := p.connect(ctx, j.Layout.ConnsPerPod, log)
			mu.Lock()
			run.open = append(run.open, ncs...)
			mu.Unlock()
			held.Add(int64(len(ncs)))
			if err == nil {
				connected.mark()
				p.conn = ncs[0]
				err = p.certify(ctx, ncs[0])
			}
			if err != nil {
				failed.Add(1)
				run.tally.failed(err)
				return
			}
			certified.Add(1)
			last.mark()
		})
	}
	wg.Wait()
	run.certified, run.failed, run.held = int(certified.Load()), int(failed.Load()), held.Load()
	run.seconds, run.last = last.since(start), last.at()
	run.start, run.times, run.connTimes = start, last.times(), connected.times()
	return run
}
