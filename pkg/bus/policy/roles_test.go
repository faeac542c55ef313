package policy_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// mesh is a secured server with a stand-in callout, the event stream and the CA
// bucket created by their owners, and a signer answering on the sign subjects.
type mesh struct {
	*bustest.Secured
	signer *nats.Conn
	// signed counts sign requests the signer received, by subject.
	signed map[string]*atomic.Int64
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	m := &mesh{Secured: bustest.SecureServer(t), signed: map[string]*atomic.Int64{}}
	m.ServeCallout(t, bustest.PodTokens)
	ctx := ctxT(t)
	var errs bustest.Errors
	m.signer = m.Conn(t, policy.Signer, &errs)
	js := bustest.JetStream(t, m.signer)
	if _, err := bus.EnsureEventStream(ctx, js, 1, time.Hour); err != nil {
		t.Fatalf("signer creates the event stream: %v %v", err, errs.All())
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: policy.BucketCA, History: 1})
	if err != nil {
		t.Fatalf("signer opens its bucket: %v %v", err, errs.All())
	}
	if _, err := kv.Put(ctx, "root", []byte("secret key")); err != nil {
		t.Fatalf("signer writes its bucket: %v %v", err, errs.All())
	}
	for _, p := range []string{"default/pod-a", "default/pod-b", "attacker/pod-b", "any"} {
		m.signed[p] = &atomic.Int64{}
	}
	_, err = m.signer.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(msg *nats.Msg) {
		name := "any"
		if pod, ok := events.PodFromSubject(msg.Subject); ok {
			name = pod.String()
		}
		if c := m.signed[name]; c != nil {
			c.Add(1)
		}
		_ = msg.Respond([]byte("signed for " + name))
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{events.SubjectTrustBundle, events.SubjectRootRotate} {
		if _, err := m.signer.QueueSubscribe(s, events.SignerQueue, func(msg *nats.Msg) { _ = msg.Respond([]byte("ok " + msg.Subject)) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.signer.Flush(); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *mesh) pod(t *testing.T, id string, errs *bustest.Errors) *nats.Conn {
	t.Helper()
	nc, err := m.PodConn(t, ref(id), "pod:"+id, errs)
	if err != nil {
		t.Fatalf("pod %s connects: %v", id, err)
	}
	return nc
}

func request(t *testing.T, nc *nats.Conn, subj string) string {
	t.Helper()
	resp, err := nc.Request(subj, []byte("req"), 5*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subj, err)
	}
	return string(resp.Data)
}

// streamMsgs counts the events both streams hold (the CA's history and the pods').
func streamMsgs(t *testing.T, m *mesh) uint64 {
	t.Helper()
	js := bustest.JetStream(t, m.Conn(t, policy.Audit, nil))
	var n uint64
	for _, name := range []string{events.StreamEvents, events.StreamPodEvents} {
		st, err := js.Stream(ctxT(t), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		n += info.State.Msgs
	}
	return n
}

func TestPodSignsAndPublishesItsEvents(t *testing.T) {
	m := newMesh(t)
	var errs bustest.Errors
	pod := m.pod(t, "pod-a", &errs)
	sign, _ := events.PodSignSubject(ref("pod-a"))
	if got := request(t, pod, sign); got != "signed for default/pod-a" {
		t.Fatalf("sign reply %q", got)
	}
	if got := request(t, pod, events.SubjectTrustBundle); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("bundle reply %q", got)
	}
	before := streamMsgs(t, m)
	up, _ := events.PodEventSubject(ref("pod-a"), events.PodEventUp)
	msg, err := events.NewMsg(up, "sds-edge/pod-a", events.PodDown{Pod: ref("pod-a")})
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Publish(ctxT(t), bustest.JetStream(t, pod), msg); err != nil {
		t.Fatalf("pod publishes its event to the stream: %v", err)
	}
	if after := streamMsgs(t, m); after != before+1 {
		t.Fatalf("stream holds %d messages, want %d", after, before+1)
	}
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("pod saw errors doing its job: %v", e)
	}
}

func TestRotatorConsumesAndKeepsItsSchedule(t *testing.T) {
	m := newMesh(t)
	var errs bustest.Errors
	nc := m.Conn(t, policy.Rotator, &errs)
	js := bustest.JetStream(t, nc)
	ctx := ctxT(t)
	if err := bus.Publish(ctx, bustest.JetStream(t, m.signer), rawEvent(events.SubjectCertIssued)); err != nil {
		t.Fatalf("signer publishes cert.issued: %v", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{
		Durable: policy.RotatorConsumer, AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubjects: []string{events.SubjectCertIssued, events.PodEventWildcard(events.PodEventDown), events.SubjectTrustChanged},
	})
	if err != nil {
		t.Fatalf("rotator creates its durable: %v", err)
	}
	if _, err := cons.Info(ctx); err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	fetchOne(ctx, t, cons)
	for _, b := range []string{policy.BucketRotator, policy.BucketRotatorLease} {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b})
		if err != nil {
			t.Fatalf("rotator creates %s: %v", b, err)
		}
		if _, err := js.KeyValue(ctx, b); err != nil {
			t.Fatalf("rotator looks up %s: %v", b, err)
		}
		rev, err := kv.Create(ctx, "k", []byte("v"))
		if err != nil {
			t.Fatalf("create key in %s: %v", b, err)
		}
		if _, err := kv.Update(ctx, "k", []byte("w"), rev); err != nil {
			t.Fatalf("update key in %s: %v", b, err)
		}
		if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "w" {
			t.Fatalf("get key in %s: %v", b, err)
		}
		w, err := kv.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("watch %s: %v", b, err)
		}
		if e := <-w.Updates(); e == nil || string(e.Value()) != "w" {
			t.Fatalf("watch %s gave %v", b, e)
		}
		_ = w.Stop()
		if err := kv.Delete(ctx, "k"); err != nil {
			t.Fatalf("delete key in %s: %v", b, err)
		}
		oc, err := js.OrderedConsumer(ctx, "KV_"+b, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"$KV." + b + ".>"}})
		if err != nil {
			t.Fatalf("ordered consumer on %s: %v", b, err)
		}
		if _, err := oc.Next(jetstream.FetchMaxWait(5 * time.Second)); err != nil {
			t.Fatalf("ordered consumer on %s: %v", b, err)
		}
	}
	// It tells pods to renew and records that it did.
	var got atomic.Int64
	pod := m.pod(t, "pod-a", nil)
	renew, _ := events.PodRenewSubject(ref("pod-a"))
	if _, err := pod.Subscribe(renew, func(*nats.Msg) { got.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := pod.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(renew, []byte("renew")); err != nil {
		t.Fatal(err)
	}
	if err := bus.Publish(ctx, js, rawEvent(events.SubjectRenewSent)); err != nil {
		t.Fatalf("rotator publishes renew_sent: %v", err)
	}
	if got := request(t, nc, events.SubjectTrustBundle); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("bundle reply %q", got)
	}
	eventually(t, func() bool { return got.Load() == 1 })
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("rotator saw errors doing its job: %v", e)
	}
}

func TestAuditReplaysTheStream(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	var errs bustest.Errors
	nc := m.Conn(t, policy.Audit, &errs)
	live := make(chan *nats.Msg, 4)
	if _, err := nc.ChanSubscribe(events.EventsWildcard, live); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := bus.Publish(ctx, bustest.JetStream(t, m.signer), rawEvent(events.SubjectCertIssued)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := bustest.JetStream(t, nc).Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatalf("audit looks up the stream: %v", err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("audit reads message %d: %v", seq, err)
		}
		if raw.Subject != events.SubjectCertIssued {
			t.Fatalf("message %d on %s", seq, raw.Subject)
		}
	}
	for range 3 {
		select {
		case <-live:
		case <-time.After(5 * time.Second):
			t.Fatal("audit missed a live event")
		}
	}
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("audit saw errors doing its job: %v", e)
	}
}

func TestAdminRotatesAndForcesRenewal(t *testing.T) {
	m := newMesh(t)
	var errs bustest.Errors
	nc := m.Conn(t, policy.Admin, &errs)
	if _, err := bus.EnsureEventStream(ctxT(t), bustest.JetStream(t, m.signer), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := bustest.JetStream(t, nc).Stream(ctxT(t), events.StreamEvents); err != nil {
		t.Fatalf("admin reads the event stream: %v", err)
	}
	for _, s := range []string{events.SubjectRootRotate, events.SubjectTrustBundle} {
		if got := request(t, nc, s); got != "ok "+s {
			t.Fatalf("%s reply %q", s, got)
		}
	}
	if got := request(t, nc, events.SubjectSignAny); got != "signed for any" {
		t.Fatalf("sign.any reply %q", got)
	}
	var got atomic.Int64
	pod := m.pod(t, "pod-b", nil)
	renew, _ := events.PodRenewSubject(ref("pod-b"))
	if _, err := pod.Subscribe(renew, func(*nats.Msg) { got.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := pod.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(renew, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return got.Load() == 1 })
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("admin saw errors doing its job: %v", e)
	}
}

// TestAdminCannotReconfigureTheEventStream: whoever may update MESHAGENT_EVENTS
// could make it capture sign requests (bearer tokens, then readable by audit) or
// source the CA bucket; the operator only reads it.
func TestAdminCannotReconfigureTheEventStream(t *testing.T) {
	m := newMesh(t)
	js := bustest.JetStream(t, m.signer)
	if _, err := bus.EnsureEventStream(ctxT(t), js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	var errs bustest.Errors
	admin := m.Conn(t, policy.Admin, &errs)
	for _, api := range []string{"STREAM.UPDATE", "STREAM.CREATE"} {
		body := `{"name":"` + events.StreamEvents + `","subjects":["` + events.EventsWildcard + `","` + events.SignWildcard + `"]}`
		if resp, err := admin.Request("$JS.API."+api+"."+events.StreamEvents, []byte(body), 500*time.Millisecond); err == nil {
			t.Fatalf("admin %s: %s", api, resp.Data)
		}
	}
	s, err := js.Stream(ctxT(t), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if subj := s.CachedInfo().Config.Subjects; !slices.Equal(subj, events.CAEventSubjects) {
		t.Fatalf("event stream subjects %v", subj)
	}
	if !violated(&errs, "$JS.API.STREAM.UPDATE."+events.StreamEvents) {
		t.Fatalf("no permission violation: %v", errs.All())
	}
}

var eventSeq atomic.Int64

// rawEvent is a message on subject with a fresh event id: what the bus sees of an
// event, without a payload the permissions do not look at.
func rawEvent(subject string) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Header.Set(events.HeaderID, fmt.Sprintf("test-%d", eventSeq.Add(1)))
	msg.Data = []byte("{}")
	return msg
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, "the condition", cond)
}

// violated reports whether errs holds a permission violation naming subject.
func violated(errs *bustest.Errors, subject string) bool {
	for _, e := range errs.All() {
		if errors.Is(e, nats.ErrPermissionViolation) && strings.Contains(e.Error(), subject) {
			return true
		}
	}
	return false
}

// fetchOne pulls one message from a durable and acks it.
func fetchOne(ctx context.Context, t *testing.T, cons jetstream.Consumer) {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatalf("ack: %v", err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("fetched %d messages, want 1 (%v)", n, batch.Error())
	}
}

// A pod reads each foreign domain's last trust.federated from the CA's history by
// direct get (so that a pod started after the announcement holds the foreign roots
// at once), and nothing else of that stream: not the last cert.issued, not a
// message by sequence, not the stream's info.
func TestPodReadsTheLastFederatedAnnouncementOnly(t *testing.T) {
	m := newMesh(t)
	js := bustest.JetStream(t, m.signer)
	fedSubj, _ := events.TrustFederatedSubject("partner.example")
	for _, s := range []string{fedSubj, events.SubjectCertIssued} {
		if _, err := js.Publish(ctxT(t), s, []byte("news on "+s)); err != nil {
			t.Fatal(err)
		}
	}
	var errs bustest.Errors
	pod := m.pod(t, "pod-a", &errs)
	last, _ := events.TrustFederatedLastSubject("partner.example")
	resp, err := pod.Request(last, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("pod's direct get of the last announcement: %v %v", err, errs.All())
	}
	if string(resp.Data) != "news on "+fedSubj {
		t.Fatalf("pod's direct get of the last announcement: %q", resp.Data)
	}
	for subj, body := range map[string]string{
		"$JS.API.DIRECT.GET." + events.StreamEvents + "." + events.SubjectCertIssued: "",
		"$JS.API.DIRECT.GET." + events.StreamEvents:                                  `{"seq":2}`,
		"$JS.API.STREAM.MSG.GET." + events.StreamEvents:                              `{"seq":2}`,
		"$JS.API.STREAM.INFO." + events.StreamEvents:                                 "",
	} {
		if resp, err := pod.Request(subj, []byte(body), 300*time.Millisecond); err == nil {
			t.Errorf("pod read %s: %q", subj, resp.Data)
		}
	}
	if !violated(&errs, "$JS.API.DIRECT.GET."+events.StreamEvents+"."+events.SubjectCertIssued) {
		t.Errorf("no permission violation reported: %v", errs.All())
	}
}
