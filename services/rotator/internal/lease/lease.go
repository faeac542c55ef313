// Package lease elects one leader among rotator replicas with a key in a JetStream
// key-value bucket. The leader rewrites the key every TTL/5 with a compare-and-set
// on its revision. A follower reads it at the same period and takes over, with a
// compare-and-set on the revision it saw, once that revision has not changed for a
// whole TTL by its own clock (no clock agreement between hosts is needed). A leader
// that cannot renew for TTL/2 steps down by itself, before any follower may take
// over. On a clean stop the leader deletes the key and a follower takes over on its
// next read. Failover after a crash takes at most TTL + 2·TTL/5.
package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats.go/jetstream"
)

// Key is the bucket key the lease lives under.
const Key = "leader"

// Lease is one replica's side of the election.
type Lease struct {
	kv       jetstream.KeyValue
	clk      clock.Clock
	instance string
	ttl      time.Duration
	log      hclog.Logger

	mu      sync.Mutex
	leader  bool
	known   bool
	holder  string
	rev     uint64    // leader: revision written last; follower: revision seen last
	seenAt  time.Time // follower: when rev was first seen
	renewed time.Time // leader: last successful renewal
	rounds  atomic.Uint64
	gained  atomic.Uint64
}

// New returns a lease for instance on kv; it does nothing until Run.
func New(kv jetstream.KeyValue, clk clock.Clock, instance string, ttl time.Duration, log hclog.Logger) *Lease {
	return &Lease{kv: kv, clk: clk, instance: instance, ttl: ttl, log: log}
}

// Period is how often the lease is renewed or read.
func (l *Lease) Period() time.Duration { return l.ttl / 5 }

// MaxFailover is the longest a crashed leader's lease keeps followers out.
func (l *Lease) MaxFailover() time.Duration { return l.ttl + 2*l.Period() }

// Leader reports whether this replica leads.
func (l *Lease) Leader() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leader
}

// Known is nil once the lease state has been read from the bus.
func (l *Lease) Known() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.known {
		return errors.New("lease state not known yet")
	}
	return nil
}

// Holder is the instance this replica last saw holding the lease.
func (l *Lease) Holder() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holder
}

// Rounds counts completed renew-or-read rounds (for tests on a fake clock).
func (l *Lease) Rounds() uint64 { return l.rounds.Load() }

// Gained counts how often this replica became leader.
func (l *Lease) Gained() uint64 { return l.gained.Load() }

// Run takes part in the election until ctx is done. While this replica leads, lead
// runs with a context that is cancelled as soon as leadership is lost; if lead
// returns while still leading, it is started again on the next round.
func (l *Lease) Run(ctx context.Context, lead func(context.Context)) error {
	t := l.clk.NewTimer(0)
	defer t.Stop()
	var cur *term
	for {
		select {
		case <-ctx.Done():
			cur.stop()
			l.release()
			return nil
		case <-t.C():
		}
		leading := l.round(ctx)
		if cur.finished() {
			cur = nil
		}
		switch {
		case leading && cur == nil:
			cur = startTerm(ctx, lead)
		case !leading && cur != nil:
			cur.stop()
			cur = nil
		}
		t.Reset(l.Period())
		l.rounds.Add(1) // after Reset: a test that saw the round may move the clock at once
	}
}

// term is one run of the leader's work.
type term struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startTerm(ctx context.Context, lead func(context.Context)) *term {
	tctx, cancel := context.WithCancel(ctx)
	t := &term{cancel: cancel, done: make(chan struct{})}
	go func() { defer close(t.done); lead(tctx) }()
	return t
}

func (t *term) stop() {
	if t != nil {
		t.cancel()
		<-t.done
	}
}

func (t *term) finished() bool {
	if t == nil {
		return false
	}
	select {
	case <-t.done:
		t.cancel()
		return true
	default:
		return false
	}
}

// round renews or reads the lease once and reports whether this replica leads.
func (l *Lease) round(ctx context.Context) bool {
	l.mu.Lock()
	leader, rev, seenAt, renewed := l.leader, l.rev, l.seenAt, l.renewed
	l.mu.Unlock()
	now := l.clk.Now()
	rctx, cancel := context.WithTimeout(ctx, max(l.Period(), time.Second))
	defer cancel()
	if leader {
		nrev, err := l.kv.Update(rctx, Key, []byte(l.instance), rev)
		switch {
		case err == nil:
			l.set(true, l.instance, nrev, now, now)
			return true
		case errors.Is(err, jetstream.ErrKeyNotFound) || isWrongRev(err):
			l.log.Warn("lease lost", "error", err)
		case now.Sub(renewed) >= l.ttl/2:
			l.log.Warn("lease not renewed in time, stepping down", "error", err)
		default:
			l.log.Debug("lease renewal failed, will retry", "error", err)
			return true
		}
		l.set(false, "", 0, now, time.Time{})
		return false
	}
	e, err := l.kv.Get(rctx, Key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return l.take(rctx, 0, now)
	}
	if err != nil {
		l.log.Debug("lease read failed", "error", err)
		return false
	}
	holder := string(e.Value())
	switch {
	case holder == l.instance: // our own previous incarnation
		return l.take(rctx, e.Revision(), now)
	case e.Revision() != rev:
		l.set(false, holder, e.Revision(), now, time.Time{})
	case now.Sub(seenAt) >= l.ttl:
		l.log.Info("lease expired, taking over", "holder", holder, "unchanged_for", now.Sub(seenAt))
		return l.take(rctx, rev, now)
	default:
		l.set(false, holder, rev, seenAt, time.Time{})
	}
	return false
}

func (l *Lease) take(ctx context.Context, rev uint64, now time.Time) bool {
	var nrev uint64
	var err error
	if rev == 0 {
		nrev, err = l.kv.Create(ctx, Key, []byte(l.instance))
	} else {
		nrev, err = l.kv.Update(ctx, Key, []byte(l.instance), rev)
	}
	if err != nil {
		l.log.Debug("lease not taken", "error", err)
		l.mu.Lock()
		l.rev, l.seenAt = 0, now // read again next round
		l.mu.Unlock()
		return false
	}
	l.log.Info("lease acquired", "instance", l.instance)
	l.gained.Add(1)
	l.set(true, l.instance, nrev, now, now)
	return true
}

func (l *Lease) set(leader bool, holder string, rev uint64, seenAt, renewed time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leader, l.holder, l.rev, l.seenAt, l.renewed, l.known = leader, holder, rev, seenAt, renewed, true
}

// release deletes the lease on a clean stop so that a follower takes over at once.
func (l *Lease) release() {
	l.mu.Lock()
	leader, rev := l.leader, l.rev
	l.leader = false
	l.mu.Unlock()
	if !leader {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.kv.Delete(ctx, Key, jetstream.LastRevision(rev)); err != nil {
		l.log.Debug("lease not released", "error", err)
		return
	}
	l.log.Info("lease released")
}

func isWrongRev(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// OpenBucket creates or opens the lease bucket.
func OpenBucket(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: bucket, Description: "meshagent rotator: leader lease", History: 1,
			Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	return kv, err
}
