package renewal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errRejected marks an event that can never be applied: it is terminated, not retried.
var errRejected = errors.New("rejected event")

// handle applies one event. A garbled event is counted, terminated and changes
// nothing; an error means the bus failed and the term must restart from the bucket.
func (r *Replica) handle(ctx context.Context, msg jetstream.Msg) error {
	nm := &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	var kind string
	var err error
	podKind, _ := events.PodEventKind(msg.Subject())
	switch {
	case msg.Subject() == events.SubjectCertIssued:
		kind = "cert.issued"
		err = r.onCertIssued(ctx, nm)
	case podKind == events.PodEventDown:
		kind = "pod.down"
		var at time.Time
		if md, merr := msg.Metadata(); merr == nil {
			at = md.Timestamp
		}
		err = r.onPodDown(ctx, nm, at)
	case msg.Subject() == events.SubjectTrustChanged:
		kind = "trust.changed"
		err = r.onTrustChanged(ctx, nm)
	default:
		kind, err = "other", fmt.Errorf("%w: unexpected subject %s", errRejected, msg.Subject())
	}
	if errors.Is(err, errRejected) {
		r.m.events.WithLabelValues(kind, "rejected").Inc()
		r.log.Warn("event rejected", "subject", msg.Subject(), "error", err)
		_ = msg.Term()
		return nil
	}
	return err
}

func (r *Replica) onCertIssued(ctx context.Context, nm *nats.Msg) error {
	ev, meta, err := events.Decode[events.CertIssued](nm)
	if err != nil {
		return fmt.Errorf("%w: %w", errRejected, err)
	}
	if ev.Pod.IsZero() {
		// Istio agents over gRPC name no pod: they renew by themselves.
		r.m.events.WithLabelValues("cert.issued", "unscheduled").Inc()
		return nil
	}
	if !ev.NotAfter.After(r.clk.Now()) {
		// Replayed history: a certificate that expired already needs no renewal.
		r.m.events.WithLabelValues("cert.issued", "expired").Inc()
		return nil
	}
	// The schedule is keyed by the pod's "<namespace>/<name>": a certificate issued
	// to a pod of the same name in another namespace is another entry, and never
	// replaces this one's.
	pod := ev.Pod.String()
	if _, err := store.Key(pod, ev.Resource); err != nil {
		// Could never be stored: refuse it before it reaches the schedule.
		return fmt.Errorf("%w: %w", errRejected, err)
	}
	if reason, err := r.verifyRecord(ctx, ev); reason != "" {
		r.m.certRejected.WithLabelValues(reason).Inc()
		return fmt.Errorf("%w: cert.issued for %s serial %s: %s: %w", errRejected, ev.Pod, ev.Serial, reason, err)
	} else if err != nil {
		return err
	}
	// The event's time is when the signer issued it: the grace ratio counts from there,
	// as Istio's agent does, not from the backdated notBefore.
	c := schedule.Cert{Pod: pod, Resource: ev.Resource, Serial: ev.Serial, Root: ev.RootFingerprint,
		NotBefore: ev.NotBefore, NotAfter: ev.NotAfter, Issued: meta.Time}
	for range 3 {
		r.mu.Lock()
		res, err := r.sched.Upsert(c, r.clk.Now())
		rec, _ := r.sched.Record(c.Pod, c.Resource)
		r.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%w: %w", errRejected, err)
		}
		switch res {
		case schedule.Duplicate:
			r.m.events.WithLabelValues("cert.issued", "duplicate").Inc()
			return nil
		case schedule.Stale:
			r.m.events.WithLabelValues("cert.issued", "stale").Inc()
			return nil
		}
		ok, err := r.persist(ctx, rec)
		if err != nil {
			return err
		}
		if ok {
			r.m.events.WithLabelValues("cert.issued", "scheduled").Inc()
			r.log.Debug("scheduled", "pod", c.Pod, "resource", rec.Resource, "serial", c.Serial,
				"renew_at", schedule.RenewAt(r.opts.Schedule, c))
			r.wake()
			return nil
		}
	}
	return fmt.Errorf("cert.issued for %s: still conflicting after 3 tries", c.Pod)
}

// onPodDown retires the pod's entries of certificates issued before the event was
// stored (at, the stream's time; zero: all of them).
func (r *Replica) onPodDown(ctx context.Context, nm *nats.Msg, at time.Time) error {
	ev, _, err := events.Decode[events.PodDown](nm)
	if err != nil {
		return fmt.Errorf("%w: %w", errRejected, err)
	}
	// The bus lets a pod publish only on its own subjects (namespace and name):
	// believe the subject, and only a pod.down for the pod that published it.
	if from, ok := events.PodFromSubject(nm.Subject); !ok || from != ev.Pod {
		return fmt.Errorf("%w: pod.down for %q on %s", errRejected, ev.Pod, nm.Subject)
	}
	pod := ev.Pod.String()
	r.mu.Lock()
	gone := r.sched.RetirePodBefore(pod, at)
	r.mu.Unlock()
	for _, res := range gone {
		if err := r.store.Delete(ctx, pod, res, 0); err != nil {
			return err
		}
	}
	r.m.events.WithLabelValues("pod.down", "retired").Inc()
	r.log.Debug("pod retired", "pod", ev.Pod, "entries", len(gone))
	return nil
}

func (r *Replica) onTrustChanged(ctx context.Context, nm *nats.Msg) error {
	ev, _, err := events.Decode[events.TrustChanged](nm)
	if err != nil {
		return fmt.Errorf("%w: %w", errRejected, err)
	}
	roots, err := pki.ParseCertPEMs(ev.Roots)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("%w: trust.changed roots: %v", errRejected, err)
	}
	if err := r.checkTrustChanged(ctx, ev); err != nil {
		return err
	}
	fps := make([]string, len(roots))
	for i, c := range roots {
		fps[i] = pki.Fingerprint(c)
	}
	r.mu.Lock()
	marked, changed := r.sched.ChangeTrust(fps[0], fps[1:], ev.Generation, r.clk.Now())
	t := r.sched.Trust()
	r.mu.Unlock()
	if !changed {
		r.m.events.WithLabelValues("trust.changed", "unchanged").Inc()
		return nil
	}
	if err := r.store.PutTrust(ctx, t); err != nil {
		return err
	}
	r.m.events.WithLabelValues("trust.changed", "applied").Inc()
	r.log.Info("root changed, renewing leaves under old roots", "root", fps[0], "generation", ev.Generation, "leaves", marked)
	r.wake()
	return nil
}
