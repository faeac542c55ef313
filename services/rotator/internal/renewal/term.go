package renewal

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// maxDeliver bounds the deliveries of one event to the rotator's consumer.
const maxDeliver = 10

// lead is one term as leader: rebuild the schedule from the bucket, then consume
// events and send renewals until ctx is cancelled (leadership lost or shutdown) or
// the bus fails, in which case the lease starts a fresh term on its next round.
func (r *Replica) lead(ctx context.Context) {
	defer func() {
		r.caughtUp.Store(false)
		r.mu.Lock()
		r.sched = nil
		r.mu.Unlock()
	}()
	if err := r.term(ctx); err != nil && ctx.Err() == nil {
		r.log.Error("leader term ended", "error", err)
	}
}

func (r *Replica) term(ctx context.Context) error {
	start := r.clk.Now()
	sched, seq, warm := r.takeMirror()
	if sched == nil {
		sched = schedule.New(r.opts.Schedule)
	}
	n, _, err := r.store.CatchUp(ctx, seq, sched, r.clk)
	if err != nil {
		return err
	}
	took := r.clk.Now().Sub(start)
	r.m.rebuildSeconds.Set(took.Seconds())
	r.m.rebuildChanges.Set(float64(n))
	r.lastRebuild.Store(int64(took))
	r.lastChanges.Store(int64(n))
	r.log.Info("schedule ready", "entries", sched.Len(), "from_standby", warm, "changes_read", n, "took", took)
	r.mu.Lock()
	r.sched = sched
	r.mu.Unlock()
	// Records are checked against the bundle: learn it before reading them. A
	// failure is no reason not to lead; the first record to need it asks again.
	r.restoreBundle(ctx)
	if err := r.refreshBundle(ctx, "leader term"); err != nil {
		r.log.Warn("cannot fetch the trust bundle", "error", err)
	}

	// Two durables of one name: the CA's history (certificates, trust changes) and
	// the pods' stream (pod.down), which pods may flood without touching the former.
	cons, err := r.consumer(ctx, events.StreamEvents, "renewal schedule", events.SubjectCertIssued, events.SubjectTrustChanged)
	if err != nil {
		return err
	}
	pods, err := r.consumer(ctx, events.StreamPodEvents, "retired pods", events.PodEventWildcard(events.PodEventDown))
	if err != nil {
		return err
	}
	var caCaught, podsCaught atomic.Bool
	caught := func(c *atomic.Bool) {
		c.Store(true)
		if caCaught.Load() && podsCaught.Load() {
			r.caughtUp.Store(true)
		}
	}
	for _, c := range []struct {
		cons jetstream.Consumer
		flag *atomic.Bool
	}{{cons, &caCaught}, {pods, &podsCaught}} {
		info, err := c.cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("consumer info: %w", err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			caught(c.flag)
		}
	}
	r.wake()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.consume(gctx, cons, func() { caught(&caCaught) }) })
	g.Go(func() error { return r.consume(gctx, pods, func() { caught(&podsCaught) }) })
	g.Go(func() error { return r.dispatch(gctx) })
	return g.Wait()
}

// consumer creates or updates the rotator's durable on stream for subjects.
func (r *Replica) consumer(ctx context.Context, stream, what string, subjects ...string) (jetstream.Consumer, error) {
	cons, err := r.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:        r.opts.Consumer,
		Description:    "meshagent rotator: " + what,
		FilterSubjects: subjects,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        10 * time.Second,
		// A message that keeps failing (each failure ends the term) is given up
		// after this many tries instead of stalling every renewal forever.
		MaxDeliver:    maxDeliver,
		MaxAckPending: 1024,
		Replicas:      r.opts.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on %s: %w", r.opts.Consumer, stream, err)
	}
	return cons, nil
}

// consume applies cons's messages until ctx ends; caughtUp is called whenever
// nothing is left pending.
func (r *Replica) consume(ctx context.Context, cons jetstream.Consumer, caughtUp func()) error {
	// At most 4 MiB buffered: the pods' stream holds events of up to 64 KiB, and the
	// server cuts off a client it has to hold more than max_pending for (8 MiB,
	// pkg/bus/embedded.MaxPending).
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(256, 4<<20))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("consume: %w", err)
		}
		if err := r.handle(ctx, msg); err != nil {
			_ = msg.NakWithDelay(time.Second)
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		_ = msg.Ack()
		if md, err := msg.Metadata(); err == nil && md.NumPending == 0 {
			caughtUp()
		}
	}
}

// adopt replaces the in-memory entry of (pod, resource) with what the bucket
// holds: after a conflict (another replica wrote it) or a failed write.
func (r *Replica) adopt(ctx context.Context, pod, resource string) error {
	rec, ok, err := r.store.Get(ctx, pod, resource)
	if err != nil {
		return err
	}
	r.m.conflicts.Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok {
		r.sched.Remove(pod, resource)
		return nil
	}
	return r.sched.Replace(rec, r.clk.Now())
}

// persist writes rec with compare-and-set and records the new revision. It
// reports false, having adopted the bucket's state, when another writer won. An
// entry that can never be stored is dropped from the schedule and reported as
// errRejected, so that it neither ends the term nor comes back.
func (r *Replica) persist(ctx context.Context, rec schedule.Record) (bool, error) {
	rev, err := r.store.Write(ctx, rec)
	if errors.Is(err, store.ErrConflict) {
		return false, r.adopt(ctx, rec.Pod, rec.Resource)
	}
	if errors.Is(err, store.ErrKeyTooLong) {
		r.mu.Lock()
		r.sched.Remove(rec.Pod, rec.Resource)
		r.mu.Unlock()
		return false, fmt.Errorf("%w: %w", errRejected, err)
	}
	if err != nil {
		return false, err
	}
	r.mu.Lock()
	r.sched.SetRev(rec.Pod, rec.Resource, rec.Serial, rev)
	r.mu.Unlock()
	return true, nil
}
