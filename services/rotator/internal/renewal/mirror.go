package renewal

import (
	"context"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
)

// mirror is a follower's warm copy of the schedule: it follows the bucket so that,
// on becoming leader, the replica reads only the changes it has not seen instead
// of rebuilding a million entries (tens of seconds) on the failover path.
type mirror struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	sched  *schedule.Schedule
	seq    uint64
	warm   bool
	events int
}

// startMirror starts following the bucket while this replica does not lead.
func (r *Replica) startMirror(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	mctx, cancel := context.WithCancel(ctx)
	m := &mirror{cancel: cancel, done: make(chan struct{}), sched: schedule.New(r.opts.Schedule)}
	r.mirrorMu.Lock()
	r.mirror = m
	r.mirrorMu.Unlock()
	go func() {
		defer close(m.done)
		r.follow(mctx, m)
	}()
}

// follow keeps m up to date until ctx is done, resuming after bus errors from the
// last change it applied.
func (r *Replica) follow(ctx context.Context, m *mirror) {
	start := r.clk.Now()
	bo := mirrorRetry.Start()
	for ctx.Err() == nil {
		m.mu.Lock()
		from := m.seq
		m.mu.Unlock()
		err := r.store.Follow(ctx, from, func(u store.Update) {
			m.mu.Lock()
			u.Apply(m.sched, r.clk.Now())
			m.seq = u.Seq
			m.events++
			m.mu.Unlock()
		}, func() {
			m.mu.Lock()
			first := !m.warm
			m.warm = true
			n := m.sched.Len()
			m.mu.Unlock()
			if first {
				r.log.Debug("standby schedule warm", "entries", n, "took", r.clk.Now().Sub(start))
			}
		})
		if err == nil || ctx.Err() != nil {
			return
		}
		wait := bo.Next()
		r.log.Warn("standby schedule lost the bucket, resuming", "error", err, "from", from, "retry_in", wait)
		// The wall clock, not r.clk: a bucket comes back in real time, and a test
		// that holds the schedule's clock still must not hold the mirror back.
		backoff.Wait(ctx, clock.Real{}, wait)
	}
}

// mirrorRetry is how a standby resumes following the bucket after losing it.
var mirrorRetry = backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}

// takeMirror stops the mirror and returns its schedule and the last bucket
// sequence applied to it (nil and 0 when there is none).
func (r *Replica) takeMirror() (*schedule.Schedule, uint64, bool) {
	r.mirrorMu.Lock()
	m := r.mirror
	r.mirror = nil
	r.mirrorMu.Unlock()
	if m == nil {
		return nil, 0, false
	}
	m.cancel()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seq == 0 {
		return nil, 0, false
	}
	return m.sched, m.seq, m.warm
}

// MirrorWarm reports whether this follower's standby schedule has caught up.
func (r *Replica) MirrorWarm() bool {
	r.mirrorMu.Lock()
	m := r.mirror
	r.mirrorMu.Unlock()
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.warm
}
