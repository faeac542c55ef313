package policy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestInventoryKeepsItsBucketAndAuditReadsIt: the inventory role (the operator service)
// consumes the events through its own durable and writes its own bucket; audit and
// admin read that bucket by sequence but cannot write it; the inventory role cannot
// take the rotator's durable or read CA state.
func TestInventoryKeepsItsBucketAndAuditReadsIt(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	var errs bustest.Errors
	nc := m.Conn(t, policy.Inventory, &errs)
	js := bustest.JetStream(t, nc)
	if err := bus.Publish(ctx, bustest.JetStream(t, m.signer), rawEvent(events.SubjectCertIssued)); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{
		Durable: policy.InventoryConsumer, AckPolicy: jetstream.AckExplicitPolicy, FilterSubjects: []string{events.SubjectCertIssued},
	})
	if err != nil {
		t.Fatalf("inventory creates its durable: %v", err)
	}
	fetchOne(ctx, t, cons)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: policy.BucketInventory, History: 1})
	if err != nil {
		t.Fatalf("inventory creates its bucket: %v", err)
	}
	rev, err := kv.Create(ctx, "pod.a.64", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, "pod.a.64", []byte("v2"), rev); err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatalf("inventory watches its bucket: %v", err)
	}
	if e := <-w.Updates(); e == nil || string(e.Value()) != "v2" {
		t.Fatalf("watch gave %v", e)
	}
	_ = w.Stop()
	if got := request(t, nc, events.SubjectTrustBundle); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("bundle reply %q", got)
	}
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("inventory refused doing its job: %v", e)
	}

	// Readers: by sequence, read only.
	for _, r := range []policy.Role{policy.Audit, policy.Admin} {
		var rerrs bustest.Errors
		rc := m.Conn(t, r, &rerrs)
		st, err := bustest.JetStream(t, rc).Stream(ctx, "KV_"+policy.BucketInventory)
		if err != nil {
			t.Fatalf("%s looks up the inventory: %v", r, err)
		}
		msg, err := st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject("$KV."+policy.BucketInventory+".>"))
		if err != nil || string(msg.Data) != "v2" {
			t.Fatalf("%s reads the inventory: %v", r, err)
		}
		if err := rc.Publish("$KV."+policy.BucketInventory+".pod.a.64", []byte("forged")); err != nil {
			t.Fatal(err)
		}
		flushed(t, rc)
		// The server reports the violation asynchronously.
		eventually(t, func() bool { return violated(&rerrs, "$KV."+policy.BucketInventory+".pod.a.64") })
	}
	if e, err := kv.Get(ctx, "pod.a.64"); err != nil || string(e.Value()) != "v2" {
		t.Fatalf("inventory changed by a reader: %v", err)
	}

	// Not the rotator's durable, not the CA bucket.
	short, cancel := contextTimeout(ctx, time.Second)
	defer cancel()
	if _, err := js.CreateOrUpdateConsumer(short, events.StreamEvents, jetstream.ConsumerConfig{Durable: policy.RotatorConsumer, AckPolicy: jetstream.AckExplicitPolicy}); err == nil {
		t.Fatal("inventory created the rotator's durable")
	}
	if _, err := js.KeyValue(short, policy.BucketCA); err == nil {
		t.Fatal("inventory opened the CA bucket")
	}
}

// TestInventoryWatchKeepsUpUnderLoad: a KV watch is an ordered push consumer with
// flow control, and the server stops delivering until the watcher answers a
// flow-control request on $JS.FC.<stream>.…; without leave to publish there the
// inventory's live view stalled after a burst of writes (issue 29: the page stayed
// at 1,447 of 5,004 certificates). Thousands of records written fast all reach the
// watcher, and the server reports no violation.
func TestInventoryWatchKeepsUpUnderLoad(t *testing.T) {
	m := newMesh(t)
	ctx, cancel := contextTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs bustest.Errors
	nc := m.Conn(t, policy.Inventory, &errs)
	js := bustest.JetStream(t, nc)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: policy.BucketInventory, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	if e := <-w.Updates(); e != nil {
		t.Fatalf("empty bucket's watch gave %v first", e.Key())
	}
	const n = 4000
	value := []byte(strings.Repeat("x", 1024)) // a certificate record's size
	go func() {
		ajs := bustest.JetStream(t, nc)
		for i := range n {
			if _, err := ajs.PublishAsync(fmt.Sprintf("$KV.%s.pod.ns.%d", policy.BucketInventory, i), value); err != nil {
				t.Errorf("put %d: %v", i, err)
				return
			}
		}
	}()
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case e := <-w.Updates():
			if e != nil {
				seen[e.Key()] = true
			}
		case <-ctx.Done():
			t.Fatalf("the watch saw %d of %d records; violations: %v", len(seen), n, errs.All())
		}
	}
	flushed(t, nc)
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("inventory refused while watching: %v", e)
	}
}
