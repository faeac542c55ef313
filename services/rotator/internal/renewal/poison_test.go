package renewal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

func (r *replica) schedPtr() *schedule.Schedule {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sched
}

// TestOverlongResourceIsTerminated: a cert.issued whose (pod, resource) key would
// overflow the NATS control line is terminated and counted, never redelivered; the
// same leader term carries on scheduling and renewing every other pod.
func TestOverlongResourceIsTerminated(t *testing.T) {
	ctx := context.Background()
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "01", now, time.Hour, "root-a")
	waitScheduled(t, r, 1)
	term := r.schedPtr()

	// pkg/events refuses to encode such a resource: build the message by hand.
	ev := events.CertIssued{Serial: "09", SPIFFEID: "spiffe://cluster.local/ns/default/sa/web-9",
		NotBefore: now, NotAfter: now.Add(time.Hour), Pod: events.PodRef{Namespace: "default", Name: "web-9"}, Resource: "default", KeyAlgorithm: "EC-P256",
		AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "root-a"}
	m, err := events.NewMsg(events.SubjectCertIssued, "test", ev)
	if err != nil {
		t.Fatal(err)
	}
	ev.Resource = "file-cert:/" + strings.Repeat("a", 3000)
	if _, err := store.Key(ev.Pod.String(), ev.Resource); !errors.Is(err, store.ErrKeyTooLong) {
		t.Fatalf("test resource fits a key: %v", err)
	}
	if m.Data, err = json.Marshal(ev); err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "rejection counted", func() bool { return counter(t, r.m.events.WithLabelValues("cert.issued", "rejected")) == 1 })
	cons, err := h.js.Consumer(ctx, events.StreamEvents, r.opts.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "poison message terminated", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.Config.MaxDeliver != maxDeliver {
		t.Fatalf("redelivered %d, max deliver %d; want 0 and %d", info.NumRedelivered, info.Config.MaxDeliver, maxDeliver)
	}

	h.issue("web-1", "02", now, time.Hour, "root-a")
	waitScheduled(t, r, 2)
	if r.schedPtr() != term {
		t.Fatal("the leader term restarted")
	}
	if _, ok := r.Record("default/web-9", ev.Resource); ok {
		t.Fatal("overlong entry scheduled")
	}
	h.clk.Add(31 * time.Minute)
	got := h.waitSent(2)
	h.settle(r)
	if ps := sortedPods(h.sent()); fmt.Sprint(ps) != "[web-0 web-1]" {
		t.Fatalf("renewals for %v (%d in all), want web-0 and web-1", ps, len(got))
	}
}

// TestUnstorableEntryIsDropped: should an entry whose key is too long reach the
// schedule anyway, the dispatcher drops it instead of ending the term, and the
// other renewals due at the same time still go out.
func TestUnstorableEntryIsDropped(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "01", now, time.Hour, "root-a")
	waitScheduled(t, r, 1)
	term := r.schedPtr()
	long := strings.Repeat("r", 3000)
	r.mu.Lock()
	_, err := r.sched.Upsert(schedule.Cert{Pod: "default/web-9", Resource: long, Serial: "09", Root: "root-a",
		NotBefore: now, NotAfter: now.Add(time.Hour)}, now)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	h.clk.Add(31 * time.Minute)
	h.waitSent(1)
	testkit.Eventually(t, "overlong entry dropped", func() bool {
		_, ok := r.Record("default/web-9", long)
		return !ok
	})
	h.settle(r)
	if got := h.sent(); len(got) != 1 || got[0].Pod != dpod("web-0") {
		t.Fatalf("renewals %+v, want one for web-0", got)
	}
	if r.schedPtr() != term || !r.Leader() {
		t.Fatal("the leader term ended")
	}
	h.issue("web-1", "02", h.clk.Now(), time.Hour, "root-a")
	testkit.Eventually(t, "web-1 scheduled", func() bool {
		rec, ok := r.Record("default/web-1", "default")
		return ok && rec.Serial == "02" && rec.Rev != 0
	})
}

// TestExistingConsumerGetsMaxDeliver: a durable consumer left by an older rotator
// (unbounded deliveries) is updated in place on the next leader term.
func TestExistingConsumerGetsMaxDeliver(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	if _, err := bus.EnsureEventStream(ctx, h.js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	opts := testOptions("r0")
	old, err := h.js.CreateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{Durable: opts.Consumer,
		FilterSubjects: []string{events.SubjectCertIssued, events.PodEventWildcard(events.PodEventDown), events.SubjectTrustChanged},
		AckPolicy:      jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if md := old.CachedInfo().Config.MaxDeliver; md != -1 {
		t.Fatalf("old consumer max deliver %d, want unbounded", md)
	}
	r := h.start(opts)
	waitLeader(t, r)
	info, err := old.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxDeliver != maxDeliver {
		t.Fatalf("max deliver %d, want %d", info.Config.MaxDeliver, maxDeliver)
	}
}
