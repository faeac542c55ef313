package renewal

import (
	"context"
	"errors"
	"fmt"
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
	start := time.Now()
	sched, seq, warm := r.takeMirror()
	if sched == nil {
		sched = schedule.New(r.opts.Schedule)
	}
	n, _, err := r.store.CatchUp(ctx, seq, sched, r.clk.Now)
	if err != nil {
		return err
	}
	took := time.Since(start)
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
	if err := r.refreshBundle(ctx, "leader term"); err != nil {
		r.log.Warn("cannot fetch the trust bundle", "error", err)
	}

	cons, err := r.js.CreateOrUpdateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{
		Durable:        r.opts.Consumer,
		Description:    "meshagent rotator: renewal schedule",
		FilterSubjects: []string{events.SubjectCertIssued, events.PodEventWildcard(events.PodEventDown), events.SubjectTrustChanged},
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
		return fmt.Errorf("create consumer %s: %w", r.opts.Consumer, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer info: %w", err)
	}
	if info.NumPending == 0 && info.NumAckPending == 0 {
		r.caughtUp.Store(true)
	}
	r.wake()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.consume(gctx, cons) })
	g.Go(func() error { return r.dispatch(gctx) })
	return g.Wait()
}

func (r *Replica) consume(ctx context.Context, cons jetstream.Consumer) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
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
			r.caughtUp.Store(true)
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
