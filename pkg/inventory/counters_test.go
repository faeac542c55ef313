package inventory_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestCountersAreKeptInTheInventory: two keepers (two operator replicas) count what
// the fleet did — certificates issued by signer, renewals by reason and rotator,
// NACKs — into the bucket, meshctl bench's apart and an event older than the ring
// not at all; an auditor sums the last hour from the bucket alone. With the event
// history then cut to its last message, the sums are unchanged: they are not read
// from it.
func TestCountersAreKeptInTheInventory(t *testing.T) {
	m := bustest.SecureServer(t)
	m.ServeCallout(t, bustest.PodTokens)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	sjs := bustest.JetStream(t, signer)
	if _, err := bus.EnsureEventStream(ctx, sjs, 1, 7*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	var errs bustest.Errors
	for i := range 2 {
		k, err := inventory.NewKeeper(ctx, m.Conn(t, policy.Inventory, &errs), 1, clock.Real{}, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		kctx, kcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- k.Run(kctx) }()
		t.Cleanup(func() {
			kcancel()
			if err := <-done; err != nil {
				t.Errorf("keeper %d: %v", i, err)
			}
		})
	}
	now := time.Now()
	for i := range 7 {
		c := issued(fmt.Sprintf("pod-%d", i), 1)
		c.NotBefore, c.NotAfter = now, now.Add(time.Hour)
		c.Signer = []string{"signer-0", "signer-1"}[i%2]
		publish(t, signer, events.SubjectCertIssued, c, now)
	}
	bench := issued("load-0", 1)
	bench.Pod.Namespace, bench.SPIFFEID = events.BenchNamespace, "spiffe://td/ns/"+events.BenchNamespace+"/sa/load"
	publish(t, signer, events.SubjectCertIssued, bench, now)
	old := issued("pod-old", 1)
	publish(t, signer, events.SubjectCertIssued, old, now.Add(-3*time.Hour)) // older than the ring
	rotator := m.Conn(t, policy.Rotator, nil)
	for i, reason := range []string{events.RenewScheduled, events.RenewScheduled, events.RenewRootRotation, events.RenewRetry} {
		msg, err := events.Encode(events.SubjectRenewSent, events.Meta{ID: events.NewID(), Source: "rotator/rotator-" + fmt.Sprint(i%2), Time: now},
			events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: fmt.Sprintf("pod-%d", i)}, Reason: reason})
		if err != nil {
			t.Fatal(err)
		}
		if err := bus.Publish(ctx, bustest.JetStream(t, rotator), msg); err != nil {
			t.Fatal(err)
		}
	}
	ref := events.PodRef{Namespace: "default", Name: "pod-0"}
	pod, err := m.PodConn(t, ref, "pod:pod-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	sdsNack, _ := events.PodEventSubject(ref, events.PodEventSDSNack)
	xdsNack, _ := events.PodEventSubject(ref, events.PodEventXDSNack)
	publish(t, pod, sdsNack, events.SDSNack{Pod: ref, Node: "n", Version: "1", Nonce: "a", Error: "bad"}, now)
	for range 2 {
		publish(t, pod, xdsNack, events.XDSNack{Pod: ref, TypeURL: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "b", ErrorDetail: "bad"}, now)
	}

	want := inventory.Tally{Issued: map[string]int{"signer-0": 4, "signer-1": 3},
		Renewals: map[string]int{events.RenewScheduled: 2, events.RenewRootRotation: 1, events.RenewRetry: 1},
		Rotators: map[string]int{"rotator-0": 2, "rotator-1": 2}, SDSNacks: 1, XDSNacks: 2, Bench: 1}
	same := func(got inventory.Tally) bool {
		return maps.Equal(got.Issued, want.Issued) && maps.Equal(got.Renewals, want.Renewals) && maps.Equal(got.Rotators, want.Rotators) &&
			got.SDSNacks == want.SDSNacks && got.XDSNacks == want.XDSNacks && got.Bench == want.Bench
	}
	auditor := m.Conn(t, policy.Audit, nil)
	var got inventory.Tally
	testkit.Eventually(t, "the inventory's counters hold the last hour", func() bool {
		snap, err := inventory.Read(ctx, auditor)
		got = snap.Counted(time.Now(), time.Hour)
		return err == nil && same(got)
	})
	if got.Failures() != 4 || got.IssuedTotal() != 7 || got.RenewalTotal() != 4 {
		t.Fatalf("totals: %+v", got)
	}

	// The history cut to its last message (the signer may reconfigure the streams):
	// the counts are what they were.
	for _, name := range []string{events.StreamEvents, events.StreamPodEvents} {
		st, err := sjs.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.MaxMsgs = 1
		if _, err := sjs.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("cut %s: %v", name, err)
		}
		if info, err := st.Info(ctx); err != nil || info.State.Msgs > 1 {
			t.Fatalf("%s still holds %v messages: %v", name, info.State.Msgs, err)
		}
	}
	snap, err := inventory.Read(ctx, auditor)
	if got := snap.Counted(time.Now(), time.Hour); err != nil || !same(got) {
		t.Fatalf("after the history was cut: %+v %v", got, err)
	}
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("the inventory role was refused: %v", e)
	}
}

// TestCounterRingComesRound: a minute's record is added to, a record two hours old
// in the same slot is started again, and an event older than the ring counts
// nowhere.
func TestCounterRingComesRound(t *testing.T) {
	now := time.Date(2026, 11, 28, 10, 30, 20, 0, time.UTC)
	issue := events.CertIssued{Signer: "s", Pod: events.PodRef{Namespace: "default", Name: "a"}}
	if _, ok := inventory.Count(issue, events.Meta{Time: now.Add(-2 * time.Hour)}, now); ok {
		t.Fatal("an event older than the ring counted")
	}
	d, ok := inventory.Count(issue, events.Meta{Time: now.Add(time.Hour)}, now) // a clock ahead: now's minute
	if !ok || d.Minute != inventory.MinuteOf(now) {
		t.Fatalf("future event: %+v %v", d, ok)
	}
	if inventory.CounterKey(d.Minute) != inventory.CounterKey(d.Minute-inventory.CounterSlots) {
		t.Fatal("the ring has no slot for two hours ago")
	}
	v := inventory.NewView()
	v.Put(inventory.CounterKey(d.Minute), []byte(fmt.Sprintf(`{"minute":%d,"issued":{"s":2}}`, d.Minute)))
	v.Put(inventory.CounterKey(d.Minute-1), []byte(fmt.Sprintf(`{"minute":%d,"issued":{"s":5}}`, d.Minute-1)))
	v.Put(inventory.CounterKey(d.Minute-70), []byte(fmt.Sprintf(`{"minute":%d,"issued":{"s":100}}`, d.Minute-70)))
	v.Put(inventory.CounterKey(d.Minute-2), []byte(`not json`))
	s := v.Snapshot()
	if got := s.Counted(now, time.Hour).IssuedTotal(); got != 7 {
		t.Fatalf("last hour: %d issued, want 7 (the record 70 minutes old left out)", got)
	}
	if got := s.Counted(now, 2*time.Hour).IssuedTotal(); got != 107 {
		t.Fatalf("last two hours: %d", got)
	}
	if len(s.Skipped) != 1 || len(s.Certs) != 0 {
		t.Fatalf("a malformed counter record: skipped %v, certs %d", s.Skipped, len(s.Certs))
	}
}
