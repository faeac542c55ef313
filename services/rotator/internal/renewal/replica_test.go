package renewal

import (
	"context"
	"crypto/x509"
	"fmt"
	"github.com/meshagent/meshagent/pkg/pki"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSendsRenewDueWhenDueAndAudits(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "0a", now, time.Hour, "root-a") // due at +30m
	h.issue("web-1", "0b", now, 2*time.Hour, "root-a")
	waitScheduled(t, r, 2)

	h.clk.Add(29 * time.Minute)
	h.settle(r)
	if got := h.sent(); len(got) != 0 {
		t.Fatalf("sent before due: %+v", got)
	}
	h.clk.Add(2 * time.Minute)
	got := h.waitSent(1)
	rd := got[0]
	if rd.Pod != dpod("web-0") || rd.Serial != "0a" || rd.Reason != events.RenewScheduled || rd.Attempt != 1 || rd.Resource != "default" {
		t.Fatalf("renew-due %+v", rd)
	}
	// The audit copy is in the stream.
	testkit.Eventually(t, "renew_sent in the stream", func() bool {
		m, err := h.js.Stream(context.Background(), events.StreamEvents)
		if err != nil {
			return false
		}
		raw, err := m.GetLastMsgForSubject(context.Background(), events.SubjectRenewSent)
		if err != nil {
			return false
		}
		a, _, err := events.Decode[events.RenewDue](&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		return err == nil && a.Pod == dpod("web-0")
	})
	if v := counter(t, r.m.sent.WithLabelValues(events.RenewScheduled)); v != 1 {
		t.Fatalf("sent counter %v", v)
	}
}

func TestReplacementOverTheBus(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "02", now, time.Hour, "root-a")
	h.issue("web-0", "01", now.Add(-time.Minute), time.Hour, "root-a") // older, arrives late
	h.issue("web-0", "02", now, time.Hour, "root-a")                   // duplicate
	waitScheduled(t, r, 1)
	testkit.Eventually(t, "stale and duplicate counted", func() bool {
		return counter(t, r.m.events.WithLabelValues("cert.issued", "stale")) == 1 &&
			counter(t, r.m.events.WithLabelValues("cert.issued", "duplicate")) == 1
	})
	if rec, _ := r.Record("default/web-0", "default"); rec.Serial != "02" {
		t.Fatalf("older cert replaced the newer: %+v", rec)
	}
	h.issue("web-0", "03", now.Add(time.Minute), time.Hour, "root-a")
	testkit.Eventually(t, "newer cert replaces", func() bool {
		rec, _ := r.Record("default/web-0", "default")
		return rec.Serial == "03"
	})
	h.clk.Add(40 * time.Minute)
	h.waitSent(1)
	h.settle(r)
	if got := h.sent(); len(got) != 1 || got[0].Serial != "03" {
		t.Fatalf("renewals %+v, want one for serial 03", got)
	}
}

func TestPodDownRetiresAndPodlessIsCounted(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "01", now, time.Hour, "root-a")
	h.issue("web-1", "02", now, time.Hour, "root-a")
	h.issue("", "03", now, time.Hour, "root-a")                        // an Istio agent over gRPC
	h.issue("web-2", "04", now.Add(-2*time.Hour), time.Hour, "root-a") // history: expired already
	waitScheduled(t, r, 2)
	testkit.Eventually(t, "expired cert counted", func() bool {
		return counter(t, r.m.events.WithLabelValues("cert.issued", "expired")) == 1
	})
	h.publish(podSubject(t, "web-0", events.PodEventDown), events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Reason: "deleted"})
	waitScheduled(t, r, 1)
	if v := counter(t, r.m.events.WithLabelValues("cert.issued", "unscheduled")); v != 1 {
		t.Fatalf("unscheduled = %v", v)
	}
	testkit.Eventually(t, "retired entry deleted from the bucket", func() bool {
		_, ok, err := r.store.Get(context.Background(), "default/web-0", "default")
		return err == nil && !ok
	})
	h.clk.Add(45 * time.Minute)
	h.waitSent(1)
	h.settle(r)
	if got := h.sent(); len(got) != 1 || got[0].Pod != dpod("web-1") {
		t.Fatalf("renewals %+v, want only web-1", got)
	}
}

func TestResendWhenNoNewCert(t *testing.T) {
	h := newHarness(t)
	opts := testOptions("r0")
	opts.Schedule.RetryAfter, opts.Schedule.RetryMax = time.Minute, 4*time.Minute
	r := h.start(opts)
	waitLeader(t, r)
	now := h.clk.Now()
	h.issue("web-0", "01", now, 10*time.Hour, "root-a")
	waitScheduled(t, r, 1)
	h.clk.Add(5 * time.Hour)
	h.waitSent(1)
	for i, step := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		h.clk.Add(step)
		got := h.waitSent(i + 2)
		last := got[len(got)-1]
		if last.Reason != events.RenewRetry || last.Attempt != i+2 || last.Serial != "01" {
			t.Fatalf("retry %d: %+v", i+1, last)
		}
	}
	if v := counter(t, r.m.retries); v != 3 {
		t.Fatalf("retries = %v", v)
	}
	// A new certificate stops the retries.
	h.issue("web-0", "02", h.clk.Now(), 10*time.Hour, "root-a")
	testkit.Eventually(t, "replaced", func() bool { rec, _ := r.Record("default/web-0", ""); return rec.Serial == "02" })
	h.clk.Add(30 * time.Minute)
	h.settle(r)
	if got := h.sent(); len(got) != 4 {
		t.Fatalf("%d renew-due after the new certificate came, want 4", len(got))
	}
}

func TestGarbledEventsChangeNothing(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "01", now, time.Hour, "root-a")
	waitScheduled(t, r, 1)

	valid, _ := events.NewMsg(events.SubjectCertIssued, "test", events.CertIssued{Serial: "1", SPIFFEID: "spiffe://x/y",
		NotBefore: now, NotAfter: now.Add(time.Hour), Pod: events.PodRef{Namespace: "default", Name: "web-9"}, KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "s", RootFingerprint: "r"})
	tests := []struct {
		name    string
		subject string
		msg     func() *nats.Msg
	}{
		{"no headers", events.SubjectCertIssued, func() *nats.Msg { return &nats.Msg{Data: []byte(`{"serial":"1"}`)} }},
		{"not json", events.SubjectCertIssued, func() *nats.Msg { m := copyMsg(valid); m.Data = []byte("garbage"); return m }},
		{"wrong type on subject", events.SubjectCertIssued, func() *nats.Msg {
			m, _ := events.NewMsg(events.SubjectCertIssued, "test", events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "web-0"}})
			return m
		}},
		{"invalid payload", events.SubjectCertIssued, func() *nats.Msg {
			m := copyMsg(valid)
			m.Data = []byte(`{"serial":"1","spiffe_id":"nope","not_before":"2026-01-01T00:00:00Z","not_after":"2025-01-01T00:00:00Z"}`)
			return m
		}},
		{"pod down without pod", podSubject(t, "web-0", events.PodEventDown), func() *nats.Msg {
			m, _ := events.NewMsg(podSubject(t, "web-0", events.PodEventDown), "test", events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "web-0"}})
			m.Data = []byte(`{"pod":""}`)
			return m
		}},
		{"pod down for another pod", podSubject(t, "web-1", events.PodEventDown), func() *nats.Msg {
			m, _ := events.NewMsg(podSubject(t, "web-1", events.PodEventDown), "test", events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "web-0"}})
			return m
		}},
		{"trust changed with bad roots", events.SubjectTrustChanged, func() *nats.Msg {
			m, _ := events.NewMsg(events.SubjectTrustChanged, "test", events.TrustChanged{TrustDomain: "td", Reason: "x",
				Roots: []string{"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}})
			return m
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.msg()
			m.Subject = tc.subject
			if _, err := h.js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, "rejection counted", func() bool { return rejected(t, r) == float64(i+1) })
			if st, _ := r.Stats(); st.Scheduled != 1 {
				t.Fatalf("schedule changed: %d entries", st.Scheduled)
			}
			if rec, ok := r.Record("default/web-0", "default"); !ok || rec.Serial != "01" {
				t.Fatalf("entry changed: %+v", rec)
			}
		})
	}
	if tr := r.sched.Trust(); tr.Current != "" {
		t.Fatalf("trust view changed: %+v", tr)
	}
	// And the consumer carries on.
	h.issue("web-1", "02", now, time.Hour, "root-a")
	waitScheduled(t, r, 2)
}

func rejected(t *testing.T, r *replica) float64 {
	var n float64
	for _, k := range []string{"cert.issued", "pod.down", "trust.changed"} {
		n += counter(t, r.m.events.WithLabelValues(k, "rejected"))
	}
	return n
}

func copyMsg(m *nats.Msg) *nats.Msg {
	c := nats.NewMsg(m.Subject)
	for k, v := range m.Header {
		c.Header[k] = append([]string(nil), v...)
	}
	c.Data = append([]byte(nil), m.Data...)
	return c
}

func TestRootRotationRenewsOldRootLeavesMostUrgentFirst(t *testing.T) {
	h := newHarness(t)
	opts := testOptions("r0")
	opts.Schedule.Rate, opts.Schedule.Burst = 10, 1
	r := h.start(opts)
	waitLeader(t, r)
	h.publish(events.SubjectTrustChanged, h.ca.trustChanged(t, 1, "root A"))
	now := h.clk.Now()
	for i := range 5 {
		// Expiries in reverse order of issue: old-4 is the most urgent.
		h.issue(fmt.Sprintf("old-%d", i), fmt.Sprint(i+1), now, time.Duration(20-i)*time.Hour, "root A")
	}
	h.issue("new-0", "99", now, time.Hour, "root B")
	waitScheduled(t, r, 6)
	h.publish(events.SubjectTrustChanged, h.ca.trustChanged(t, 2, "root B", "root A"))
	testkit.Eventually(t, "trust applied", func() bool { return counter(t, r.m.events.WithLabelValues("trust.changed", "applied")) == 2 })
	// One token every 100 ms at 10/s: step the clock until all five went out. (A
	// step can land before the dispatcher re-armed its timer; the next one wakes it.)
	for i := 0; len(h.sent()) < 5 && i < 500; i++ {
		n := len(h.sent())
		h.clk.Add(100 * time.Millisecond)
		for j := 0; j < 20 && len(h.sent()) == n; j++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
	h.settle(r)
	got := h.sent()
	if len(got) != 5 {
		t.Fatalf("renewals %+v, want the 5 old-root leaves", got)
	}
	for i, rd := range got {
		if want := fmt.Sprintf("old-%d", 4-i); rd.Pod != dpod(want) || rd.Reason != events.RenewRootRotation {
			t.Fatalf("renewal %d: %s %s, want %s root-rotation (most urgent first)", i, rd.Pod, rd.Reason, want)
		}
	}
	if _, fpB := h.ca.root("root B"); r.sched.Trust().Current != fpB || r.sched.Trust().Generation != 2 {
		t.Fatalf("trust view %+v", r.sched.Trust())
	}
}

func TestReadyAfterCatchingUp(t *testing.T) {
	h := newHarness(t)
	now := h.clk.Now()
	// History written before any rotator runs (the stream is the signer's too).
	if _, err := h.js.CreateOrUpdateStream(context.Background(), jetstream.StreamConfig{Name: events.StreamEvents, Subjects: events.CAEventSubjects}); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		h.issue(fmt.Sprintf("p-%d", i), fmt.Sprint(i+1), now, time.Hour, "root-a")
	}
	r := h.start(testOptions("r0"))
	waitLeader(t, r)
	if st, _ := r.Stats(); st.Scheduled != 50 {
		t.Fatalf("ready with %d of 50 entries", st.Scheduled)
	}
}

func podSubject(t *testing.T, pod, kind string) string {
	t.Helper()
	s, err := events.PodEventSubject(dpod(pod), kind)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A signer backdates notBefore (clock skew); the grace ratio counts from issuance —
// the cert.issued event's time — as Istio's agent does, not from notBefore.
func TestScheduleCountsFromIssuance(t *testing.T) {
	h, r := newLeader(t)
	issued := h.clk.Now()
	ev := h.ca.record(t, "web-0", "0c", issued.Add(-10*time.Minute), time.Hour, "root-a") // 50m left at issuance
	h.publishAt(events.SubjectCertIssued, ev, issued)
	waitScheduled(t, r, 1)
	// From notBefore it would be due at +20m; from issuance, at +25m (half of 50m).
	h.clk.Add(21 * time.Minute)
	h.settle(r)
	if got := h.sent(); len(got) != 0 {
		t.Fatalf("due counted from the backdated notBefore: %+v", got)
	}
	h.clk.Add(5 * time.Minute)
	if got := h.waitSent(1); got[0].Serial != "0c" {
		t.Fatalf("renew-due %+v", got[0])
	}
}

// TestSameNameInAnotherNamespaceIsAnotherEntry: attacker/web-0, a pod of another
// namespace with default/web-0's name, gets a genuine certificate (of its own
// identity) and says it stopped; default/web-0's schedule entry is neither replaced
// nor retired, in memory or in the bucket, and a record of the attacker's identity
// naming default/web-0 is rejected.
func TestSameNameInAnotherNamespaceIsAnotherEntry(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "01", now, time.Hour, "root-a")
	waitScheduled(t, r, 1)

	evil := events.PodRef{Namespace: "attacker", Name: "web-0"}
	attackerRecord := func(serial string, pod events.PodRef) events.CertIssued {
		id := "spiffe://cluster.local/ns/attacker/sa/evil"
		leaf := h.ca.leaf(t, id, serial, now, 10*time.Hour, "root-a")
		_, fp := h.ca.root("root-a")
		return events.CertIssued{Serial: serial, SPIFFEID: id, NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, Pod: pod,
			Resource: "default", KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: fp,
			CertChain: pki.CertPEMs([]*x509.Certificate{leaf})}
	}
	victimKept := func(what string) {
		t.Helper()
		if rec, ok := r.Record("default/web-0", "default"); !ok || rec.Serial != "01" {
			t.Fatalf("%s: default/web-0's entry is %+v (present %v), want serial 01", what, rec, ok)
		}
		if rec, ok, err := r.store.Get(context.Background(), "default/web-0", "default"); err != nil || !ok || rec.Serial != "01" {
			t.Fatalf("%s: default/web-0's bucket entry is %+v (present %v, %v), want serial 01", what, rec, ok, err)
		}
	}

	// A certificate issued to attacker/web-0 is attacker/web-0's entry.
	h.publishAt(events.SubjectCertIssued, attackerRecord("02", evil), now)
	waitScheduled(t, r, 2)
	if rec, ok := r.Record("attacker/web-0", "default"); !ok || rec.Serial != "02" {
		t.Fatalf("attacker/web-0's entry %+v (present %v)", rec, ok)
	}
	victimKept("after attacker/web-0's certificate")

	// A record of the attacker's identity naming default/web-0: rejected.
	h.publishAt(events.SubjectCertIssued, attackerRecord("03", events.PodRef{Namespace: "default", Name: "web-0"}), now)
	testkit.Eventually(t, "the record naming another namespace's pod rejected", func() bool {
		return counter(t, r.m.certRejected.WithLabelValues(reasonMismatch)) == 1
	})
	victimKept("after a record naming default/web-0 for the attacker's identity")

	// pod.down on the attacker's own subject naming default/web-0: rejected; as
	// itself: retires its own entry only.
	evilDown, err := events.PodEventSubject(evil, events.PodEventDown)
	if err != nil {
		t.Fatal(err)
	}
	h.publish(evilDown, events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Reason: "forged"})
	h.publish(evilDown, events.PodDown{Pod: evil, Reason: "shutdown"})
	waitScheduled(t, r, 1)
	testkit.Eventually(t, "attacker/web-0's entry gone from the bucket", func() bool {
		_, ok, err := r.store.Get(context.Background(), "attacker/web-0", "default")
		return err == nil && !ok
	})
	if v := counter(t, r.m.events.WithLabelValues("pod.down", "rejected")); v != 1 {
		t.Fatalf("pod.down rejected = %v, want the forged one", v)
	}
	victimKept("after attacker/web-0's pod.down")
}

// TestRenewSentHeldWhileTheStreamIsAway: a renew_sent the stream cannot take (here
// the stream stops taking rotation subjects; in the compose suite, its leader's node
// paused 40 s) is held and stored once the stream takes it again, not dropped after
// one attempt, while the renew-due itself reaches the pod at once.
func TestRenewSentHeldWhileTheStreamIsAway(t *testing.T) {
	h, r := newLeader(t)
	ctx := context.Background()
	h.issue("web-0", "0a", h.clk.Now(), time.Hour, "root-a") // due at +30m
	waitScheduled(t, r, 1)

	st, err := h.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	whole := st.CachedInfo().Config
	cut := whole
	cut.Subjects = nil
	for _, s := range whole.Subjects {
		if s != events.Prefix+".evt.rotation.>" {
			cut.Subjects = append(cut.Subjects, s)
		}
	}
	if len(cut.Subjects) == len(whole.Subjects) {
		t.Fatalf("the stream's subjects %v have no rotation wildcard to take away", whole.Subjects)
	}
	if _, err := h.js.UpdateStream(ctx, cut); err != nil {
		t.Fatal(err)
	}
	// The control: the stream really refuses a renew_sent now.
	probe, err := events.Encode(events.SubjectRenewSent, events.Meta{Source: "test"},
		events.RenewDue{Pod: dpod("probe"), Resource: "default", Serial: "ff", NotAfter: h.clk.Now().Add(time.Hour), Reason: events.RenewScheduled, Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.PublishMsg(ctx, probe); err == nil {
		t.Fatal("the stream took a renew_sent with its rotation subjects removed: this test could not show the hold")
	}

	h.clk.Add(31 * time.Minute)
	if rd := h.waitSent(1)[0]; rd.Pod != dpod("web-0") {
		t.Fatalf("renew-due %+v", rd)
	}
	// Every attempt is a request on the subject, seen by a plain subscriber: wait
	// until the stream has refused several (the rotator used to try for 5 s, then drop it).
	attempts := bustest.Record(t, h.nc, events.SubjectRenewSent)
	testkit.Eventually(t, "three attempts at the renew_sent while the stream is away", func() bool {
		h.clk.Add(time.Second) // the outbox's wait between attempts
		n := 0
		for _, m := range attempts.Msgs() {
			if m.Header.Get(events.HeaderSubject) == "default/web-0" {
				n++
			}
		}
		return n >= 3
	})
	if _, err := st.GetLastMsgForSubject(ctx, events.SubjectRenewSent); err == nil {
		t.Fatal("a renew_sent was stored while the stream did not take the subject")
	}
	if _, err := h.js.UpdateStream(ctx, whole); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "renew_sent stored once the stream takes it", func() bool {
		h.clk.Add(time.Second) // the outbox's wait before its next attempt
		raw, err := st.GetLastMsgForSubject(ctx, events.SubjectRenewSent)
		if err != nil {
			return false
		}
		a, _, err := events.Decode[events.RenewDue](&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		return err == nil && a.Pod == dpod("web-0") && a.Serial == "0a"
	})
	if n, err := testutil.GatherAndCount(r.reg, "meshagent_rotator_audit_dropped_total"); err != nil || n != 1 {
		t.Fatalf("audit drop counter: %d series, %v", n, err)
	}
	mfs, _ := r.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "meshagent_rotator_audit_dropped_total" && mf.GetMetric()[0].GetCounter().GetValue() != 0 {
			t.Fatalf("%v audit records dropped", mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
}
