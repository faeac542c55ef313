package renewal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
)

// dispatch sends renewals when they come due, sleeping on the clock in between.
func (r *Replica) dispatch(ctx context.Context) error {
	t := r.clk.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		case <-r.kick:
		}
		if err := r.sendDue(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		now := r.clk.Now()
		r.mu.Lock()
		next, ok := r.sched.NextWake(now)
		r.mu.Unlock()
		d := time.Hour
		if ok {
			d = max(0, next.Sub(r.clk.Now())) // re-read: the clock may have moved meanwhile
		}
		t.Stop()
		t.Reset(d)
	}
}

// sendDue sends everything due now that the rate limit allows. Each renewal's new
// state is written to the bucket (compare-and-set) before it is sent, so that of
// two replicas that both think they lead, only one sends it; a crash between the
// write and the send delays that renewal to its retry deadline.
func (r *Replica) sendDue(ctx context.Context) error {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	for ctx.Err() == nil {
		r.mu.Lock()
		due := r.sched.Take(r.clk.Now(), r.opts.Batch)
		recs := make([]schedule.Record, len(due))
		for i, d := range due {
			if !d.Retired {
				recs[i], _ = r.sched.Record(d.Pod, d.Resource)
			}
		}
		r.mu.Unlock()
		if len(due) == 0 {
			return nil
		}
		for i, d := range due {
			if ctx.Err() != nil {
				return nil // the rest was never written: the next leader sends it
			}
			if err := r.renew(ctx, d, recs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// renew records one renewal as sent and sends it. Once the record is written the
// send goes ahead even if leadership is lost meanwhile: cancelling between the
// two would leave a renewal marked sent that nobody sent.
func (r *Replica) renew(ctx context.Context, d schedule.Renewal, rec schedule.Record) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var ok bool
	var err error
	if d.Retired {
		err = r.store.Delete(wctx, d.Pod, d.Resource, d.Rev)
		ok = err == nil
		if isConflict(err) {
			ok, err = false, r.adopt(wctx, d.Pod, d.Resource)
		}
	} else {
		rec.Rev = d.Rev
		ok, err = r.persist(wctx, rec)
	}
	if errors.Is(err, errRejected) {
		r.log.Warn("renewal dropped", "pod", clip(d.Pod), "resource", clip(d.Resource), "error", err)
		return nil
	}
	if err != nil {
		return err
	}
	if ok { // else another replica sent it
		r.send(d)
	}
	return nil
}

func isConflict(err error) bool { return errors.Is(err, store.ErrConflict) }

// send publishes renew-due to the pod (core NATS) and queues its audit record for the
// stream.
func (r *Replica) send(d schedule.Renewal) {
	pod, err := events.PodRefFromString(d.Pod) // the schedule's key: "<namespace>/<name>"
	if err != nil {
		r.m.sendErrors.Inc()
		r.log.Warn("renew-due not sent", "pod", clip(d.Pod), "resource", clip(d.Resource), "error", err)
		return
	}
	rd := events.RenewDue{Pod: pod, Resource: d.Resource, Serial: d.Serial, NotAfter: d.NotAfter,
		Reason: d.Reason, Attempt: d.Attempt}
	meta := events.Meta{ID: renewalID(d), Source: "rotator/" + r.opts.Instance, Subject: d.Pod, Time: r.clk.Now()}
	if err := r.publishPod(meta, rd); err != nil {
		r.m.sendErrors.Inc()
		r.log.Warn("renew-due not sent", "pod", d.Pod, "resource", d.Resource, "error", err)
		return
	}
	r.m.sent.WithLabelValues(d.Reason).Inc()
	if d.Reason == events.RenewRetry {
		r.m.retries.Inc()
	}
	if d.RateLimited {
		r.m.rateLimited.Inc()
	}
	if d.Retired {
		r.m.expired.Inc()
		r.log.Warn("certificate expired without renewal, entry retired", "pod", d.Pod, "resource", d.Resource, "serial", d.Serial)
	}
	r.log.Debug("renew-due sent", "pod", d.Pod, "resource", d.Resource, "reason", d.Reason, "attempt", d.Attempt)
	// The audit record goes through the outbox: held while the stream has no leader
	// (a paused node), sent when it is back, once (its id is the dedup id).
	audit, err := events.Encode(events.SubjectRenewSent, meta, rd)
	if err != nil {
		r.m.sendErrors.Inc()
		r.log.Warn("renew-sent audit not encoded", "pod", d.Pod, "error", err)
		return
	}
	r.audit.PublishMsg(audit)
}

func (r *Replica) publishPod(meta events.Meta, rd events.RenewDue) error {
	subj, err := events.PodRenewSubject(rd.Pod)
	if err != nil {
		return err
	}
	msg, err := events.Encode(subj, meta, rd)
	if err != nil {
		return fmt.Errorf("encode renew-due: %w", err)
	}
	return r.nc.PublishMsg(msg)
}

// renewalID is the same for the same renewal attempt on every replica, so the
// stream's duplicate window drops a repeat and sds-edge can recognise one.
func renewalID(d schedule.Renewal) string {
	h := sha256.Sum256([]byte(d.Pod + "\x00" + d.Resource + "\x00" + d.Serial + "\x00" + strconv.Itoa(d.Attempt)))
	return hex.EncodeToString(h[:16])
}

// clip shortens a name for the log: an unstorable one may be kilobytes long.
func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:64], len(s))
}
