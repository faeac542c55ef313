// Package renewal runs the fleet's renewal schedule on the bus: it consumes
// cert.issued, pod.down and trust.changed from the event stream with a durable
// consumer, keeps the schedule (package schedule) durable in a key-value bucket
// (package store), and, while it holds the leader lease (package lease), sends
// renew-due to each pod when its certificate is due, rate-limited fleet-wide and
// most urgent first.
//
// High availability: one leader at a time, chosen by a lease in a KV bucket
// (crash failover at most 1.4 x the lease TTL; a clean stop hands over within one
// lease period). Followers keep a warm copy of the schedule by following the
// bucket, so a new leader reads only the changes it missed. Every entry write is a
// compare-and-set on its revision and a renewal is recorded as sent before it is
// sent, so even two replicas that both believe they lead send each renewal once;
// a leader dying between the write and the send delays that renewal to its retry
// deadline (-retry-after), never loses it.
package renewal

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/outbox"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/rotator/internal/lease"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options configures a Replica.
type Options struct {
	Schedule    schedule.Config
	Instance    string        // unique per replica
	LeaseTTL    time.Duration // failover after a crash takes at most LeaseTTL*7/5
	Consumer    string        // durable consumer name, shared by all replicas
	Bucket      string        // schedule bucket
	LeaseBucket string
	Replicas    int // JetStream replicas of the buckets and the consumer
	Batch       int // renewals taken per pass
	// TrustDomain of the bundles to accept; "" accepts any (endorsement still needed).
	TrustDomain string
	// Anchors are roots trusted before the first bundle, which must be endorsed by
	// one of them; none: the first bundle requested is trusted on first use.
	Anchors []*x509.Certificate
	// BundleRefresh is the least time between two bundle requests made because a
	// record names an unknown root.
	BundleRefresh time.Duration
}

// Replica is one rotator replica.
type Replica struct {
	opts Options
	nc   *nats.Conn
	js   jetstream.JetStream
	clk  clock.Clock
	log  hclog.Logger
	m    *metrics

	// audit publishes rotation.renew_sent, holding it while the stream is away.
	audit *outbox.Outbox

	lease *lease.Lease
	store *store.Store

	// trust is the bundle cert.issued records are checked against.
	trust       *trustbundle.Set
	refreshMu   sync.Mutex
	lastRefresh time.Time
	bootOnce    sync.Once

	mu    sync.Mutex // guards sched and everything in it
	sched *schedule.Schedule

	mirrorMu sync.Mutex
	mirror   *mirror // the standby schedule while following

	writeMu  sync.Mutex // serialises change-then-persist sequences
	kick     chan struct{}
	caughtUp atomic.Bool
	started  atomic.Bool

	lastRebuild atomic.Int64 // nanoseconds
	lastChanges atomic.Int64
}

// LastRebuild is how long the last leader term took to get its schedule ready and
// how many bucket changes it read (0 when the standby schedule was up to date).
func (r *Replica) LastRebuild() (time.Duration, int) {
	return time.Duration(r.lastRebuild.Load()), int(r.lastChanges.Load())
}

// New returns a replica using JetStream on d.Bus, its clock, logger and metrics
// registry; it touches nothing until Run.
func New(opts Options, d lifecycle.Deps) (*Replica, error) {
	if opts.Batch <= 0 {
		opts.Batch = 256
	}
	if opts.Instance == "" || opts.Consumer == "" || opts.Bucket == "" || opts.LeaseBucket == "" || opts.LeaseTTL <= 0 {
		return nil, errors.New("rotator: instance, consumer, buckets and lease ttl are required")
	}
	if d.Bus == nil {
		return nil, errors.New("rotator: no bus connection")
	}
	d = d.WithDefaults()
	js, err := jetstream.New(d.Bus)
	if err != nil {
		return nil, fmt.Errorf("rotator: jetstream: %w", err)
	}
	r := &Replica{opts: opts, nc: d.Bus, js: js, clk: d.Clock, log: d.Log, kick: make(chan struct{}, 1),
		trust: trustbundle.New(opts.TrustDomain, opts.Anchors, d.Clock)}
	m, err := newMetrics(r, d.Metrics)
	if err != nil {
		return nil, err
	}
	r.m = m
	// A stream outage as long as the longest one tested (a leader's node paused 40 s)
	// at a storm's renew rate fits; what does not is counted, never waited for.
	if r.audit, err = outbox.New(js, outbox.Options{Source: "rotator/" + opts.Instance, Size: 8192, Flush: 3 * time.Second,
		Metric: "meshagent_rotator_audit_dropped_total", Registry: d.Metrics, Log: d.Log.Named("audit"), Clock: d.Clock}); err != nil {
		return nil, err
	}
	return r, nil
}

// Run sets up the stream and buckets, then takes part in the leader election until
// ctx is done. It returns nil on cancellation.
func (r *Replica) Run(ctx context.Context) error {
	return lifecycle.Tasks(ctx, r.audit.Run, r.run)
}

// run is what Run does beside the audit outbox.
func (r *Replica) run(ctx context.Context) error {
	if err := r.setup(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.started.Store(true)
	r.startMirror(ctx)
	defer func() { _, _, _ = r.takeMirror() }()
	r.log.Info("rotator started", "instance", r.opts.Instance, "lease_ttl", r.opts.LeaseTTL,
		"max_failover", r.lease.MaxFailover(), "rate", r.opts.Schedule.Rate)
	return r.lease.Run(ctx, func(tctx context.Context) {
		r.lead(tctx)
		r.startMirror(ctx) // back to following (unless shutting down)
	})
}

func (r *Replica) setup(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.awaitStream(sctx); err != nil {
		return err
	}
	// A cluster that lost a node while its buckets are created or opened says "no
	// suitable peers" or "stream offline" until it has healed: wait, as for the stream.
	err := bus.Retry(sctx, clock.Real{}, r.log, "schedule bucket "+r.opts.Bucket, func(ctx context.Context) error {
		st, err := store.Open(ctx, r.js, r.opts.Bucket, r.opts.Replicas, r.log.Named("store"))
		r.store = st
		return err
	})
	if err != nil {
		return err
	}
	var kv jetstream.KeyValue
	err = bus.Retry(sctx, clock.Real{}, r.log, "lease bucket "+r.opts.LeaseBucket, func(ctx context.Context) (err error) {
		kv, err = lease.OpenBucket(ctx, r.js, r.opts.LeaseBucket, r.opts.Replicas)
		return err
	})
	if err != nil {
		return fmt.Errorf("open lease bucket %s: %w", r.opts.LeaseBucket, err)
	}
	r.lease = lease.New(kv, r.clk, r.opts.Instance, r.opts.LeaseTTL, r.log.Named("lease"))
	return nil
}

// awaitStream waits until the event stream exists. The signer creates it; the
// rotator may only read it (pkg/bus/policy), so on a fresh bus it waits, until
// ctx's deadline, instead of creating it. Each look-up is a short attempt
// (bus.Retry): a cluster still electing its JetStream leader leaves requests
// unanswered, and one long request would outlast the moment the stream appears.
func (r *Replica) awaitStream(ctx context.Context) error {
	return bus.Retry(ctx, clock.Real{}, r.log, "event stream "+events.StreamEvents+" (a signer creates it)", func(ctx context.Context) error {
		for _, name := range []string{events.StreamEvents, events.StreamPodEvents} {
			_, err := r.js.Stream(ctx, name)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return bus.Pending(fmt.Errorf("%s: %w", name, err))
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// Ready is nil once the lease state is known and, on the leader, the schedule is
// loaded and the consumer has caught up with the stream.
func (r *Replica) Ready() error {
	if !r.started.Load() {
		return errors.New("not connected to the stream and buckets yet")
	}
	if err := r.lease.Known(); err != nil {
		return err
	}
	if r.lease.Leader() && !r.caughtUp.Load() {
		return errors.New("leader still loading the schedule or catching up with the stream")
	}
	return nil
}

// Leader reports whether this replica currently leads.
func (r *Replica) Leader() bool { return r.started.Load() && r.lease.Leader() }

// Lease exposes the election (for tests and the failover benchmark).
func (r *Replica) Lease() *lease.Lease { return r.lease }

// Stats returns the schedule's counts; ok is false when this replica does not lead.
func (r *Replica) Stats() (schedule.Stats, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sched == nil {
		return schedule.Stats{}, false
	}
	return r.sched.Stats(), true
}

// Record returns the schedule entry of (pod, resource) while this replica leads.
func (r *Replica) Record(pod, resource string) (schedule.Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sched == nil {
		return schedule.Record{}, false
	}
	return r.sched.Record(pod, resource)
}

func (r *Replica) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}
