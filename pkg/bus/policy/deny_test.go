package policy_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go"
)

// counter subscribes subj on nc and counts what arrives.
func counter(t *testing.T, nc *nats.Conn, subj string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	if _, err := nc.Subscribe(subj, func(*nats.Msg) { n.Add(1) }); err != nil {
		t.Fatal(err)
	}
	return &n
}

// flushed waits until the server has processed everything nc sent, and its
// asynchronous errors (a denied subscribe or publish) have been delivered.
func flushed(t *testing.T, ncs ...*nats.Conn) {
	t.Helper()
	for _, nc := range ncs {
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAuditCannotTouchCAStateOrRequests: the shared read-only role (and a role with
// the same lists) cannot read the CA bucket, see sign requests (they carry tokens),
// or speak for the signer or an operator.
func TestAuditCannotTouchCAStateOrRequests(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	var errs bustest.Errors
	audit := m.Conn(t, policy.Audit, &errs)
	js := bustest.JetStream(t, audit)

	// The bucket and its stream: no lookup, no direct read, no subscription to puts.
	kvPuts := counter(t, audit, "$KV."+policy.BucketCA+".>")
	streamSubjects := counter(t, audit, "$JS.API.>")
	signReqs := counter(t, audit, events.SignWildcard)
	inboxes := counter(t, audit, "_INBOX.>")
	flushed(t, audit)
	short, cancel := contextTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := js.KeyValue(short, policy.BucketCA); err == nil {
		t.Fatal("audit opened the CA bucket")
	}
	if resp, err := audit.Request("$JS.API.STREAM.MSG.GET.KV_"+policy.BucketCA, []byte(`{"last_by_subj":"$KV.meshagent-ca.root"}`), 300*time.Millisecond); err == nil {
		t.Fatalf("audit read the CA stream: %s", resp.Data)
	}
	if resp, err := audit.Request("$JS.API.DIRECT.GET.KV_"+policy.BucketCA, []byte(`{"last_by_subj":"$KV.meshagent-ca.root"}`), 300*time.Millisecond); err == nil {
		t.Fatalf("audit read the CA stream directly: %s", resp.Data)
	}
	// The signer writes and a pod signs while audit listens: nothing reaches audit.
	kv, err := bustest.JetStream(t, m.signer).KeyValue(ctx, policy.BucketCA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "root", []byte("another secret")); err != nil {
		t.Fatal(err)
	}
	pod := m.pod(t, "pod-a", nil)
	sign, _ := events.PodSignSubject(ref("pod-a"))
	request(t, pod, sign)

	// Publishing what only the signer or an operator may: nobody receives it, the
	// stream does not store it.
	before := streamMsgs(t, m)
	trust := counter(t, m.Conn(t, policy.Admin, nil), events.SubjectTrustChanged)
	rotates := counter(t, m.signer, events.SubjectRootRotate)
	flushed(t, m.signer)
	for _, s := range []string{events.SubjectTrustChanged, events.SubjectRootRotate, events.SubjectCertIssued, "$KV." + policy.BucketCA + ".root"} {
		if err := audit.Publish(s, []byte("forged")); err != nil {
			t.Fatal(err)
		}
	}
	flushed(t, audit)
	// Deliveries to audit of what it subscribed: its own inbox replies only.
	if n := kvPuts.Load() + streamSubjects.Load() + signReqs.Load() + inboxes.Load(); n != 0 {
		t.Fatalf("audit received %d messages it may not see", n)
	}
	if trust.Load()+rotates.Load() != 0 {
		t.Fatal("a forged trust.changed or root.rotate from audit was delivered")
	}
	if got := streamMsgs(t, m); got != before {
		t.Fatalf("stream grew from %d to %d on audit's publishes", before, got)
	}
	if e, err := kv.Get(ctx, "root"); err != nil || string(e.Value()) != "another secret" {
		t.Fatalf("CA bucket changed: %v", err)
	}
	for _, s := range []string{events.SubjectTrustChanged, events.SubjectRootRotate, events.SignWildcard, "$KV." + policy.BucketCA + ".>"} {
		if !violated(&errs, s) {
			t.Errorf("no permission violation reported for %s; got %v", s, errs.All())
		}
	}
}

// TestPodConfinedToItself: pod A cannot listen to or speak for pod B, answer sign
// requests, or announce trust changes.
func TestPodConfinedToItself(t *testing.T) {
	m := newMesh(t)
	var errs bustest.Errors
	a := m.pod(t, "pod-a", &errs)
	b := m.pod(t, "pod-b", nil)
	rotator := m.Conn(t, policy.Rotator, nil)

	renewB, _ := events.PodRenewSubject(ref("pod-b"))
	renewA, _ := events.PodRenewSubject(ref("pod-a"))
	stolen := counter(t, a, renewB)
	stolenAll := counter(t, a, "meshagent.pod.>")
	stolenInbox := counter(t, a, "_INBOX.pod.default.pod-b.>")
	answered := counter(t, a, events.SignWildcard)
	own := counter(t, a, renewA)
	gotB := counter(t, b, renewB)
	trust := counter(t, b, events.SubjectTrustChanged)
	flushed(t, a, b)

	// The rotator renews B, then A: A sees its own and nothing of B's.
	for _, s := range []string{renewB, renewA} {
		if err := rotator.Publish(s, []byte("renew")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, func() bool { return own.Load() == 1 && gotB.Load() == 1 })
	// B signs (its reply goes to B's inbox) while A subscribes sign requests.
	signB, _ := events.PodSignSubject(ref("pod-b"))
	if got := request(t, b, signB); got != "signed for default/pod-b" {
		t.Fatalf("B's sign reply %q", got)
	}

	// A speaks for B: sign request, events, anchors; and for the signer.
	before := streamMsgs(t, m)
	eventB, _ := events.PodEventSubject(ref("pod-b"), events.PodEventDown)
	anchorsB, _ := events.PodAnchorsSubject(ref("pod-b"))
	for _, s := range []string{signB, eventB, anchorsB, events.SubjectTrustChanged, events.SubjectCertIssued, renewB} {
		if err := a.Publish(s, []byte("forged")); err != nil {
			t.Fatal(err)
		}
	}
	flushed(t, a)
	// A's own request still works after the refusals, so the server did see them.
	signA, _ := events.PodSignSubject(ref("pod-a"))
	if got := request(t, a, signA); got != "signed for default/pod-a" {
		t.Fatalf("A's sign reply %q", got)
	}
	if n := stolen.Load() + stolenAll.Load() + stolenInbox.Load() + answered.Load(); n != 0 {
		t.Fatalf("pod A received %d messages meant for others", n)
	}
	if m.signed["default/pod-b"].Load() != 1 {
		t.Fatalf("signer saw %d sign requests for pod-b, want only B's own", m.signed["default/pod-b"].Load())
	}
	if gotB.Load() != 1 || trust.Load() != 0 {
		t.Fatal("pod B received A's forgeries")
	}
	if got := streamMsgs(t, m); got != before {
		t.Fatalf("stream grew from %d to %d on A's forgeries", before, got)
	}
	for _, s := range []string{renewB, "_INBOX.pod.default.pod-b.>", events.SignWildcard, signB, eventB, events.SubjectTrustChanged} {
		if !violated(&errs, s) {
			t.Errorf("no permission violation reported for %s", s)
		}
	}
	// No JetStream API: A cannot look at the CA bucket or the stream's consumers.
	short, cancel := contextTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	if _, err := bustest.JetStream(t, a).KeyValue(short, policy.BucketCA); err == nil {
		t.Fatal("a pod opened the CA bucket")
	}
}

// TestPodPublishesOnlyItsEventKinds: a pod may publish its events of the known
// kinds and no subject of its own making below them, so that it cannot spread a
// flood over new subjects (each with its own per-subject quota in the pods' stream).
func TestPodPublishesOnlyItsEventKinds(t *testing.T) {
	m := newMesh(t)
	var errs bustest.Errors
	a := m.pod(t, "pod-a", &errs)
	js := bustest.JetStream(t, a)
	own, _ := events.PodEventSubject(ref("pod-a"), events.PodEventDown)
	msg, err := events.NewMsg(own, "sds-edge/pod-a", events.PodDown{Pod: ref("pod-a"), Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	before := streamMsgs(t, m)
	if err := bus.Publish(ctxT(t), js, msg); err != nil {
		t.Fatalf("a pod's own pod.down: %v", err)
	}
	made := strings.TrimSuffix(own, events.PodEventDown) + "made.up"
	for _, s := range []string{made, strings.TrimSuffix(own, "."+events.PodEventDown)} {
		if err := a.Publish(s, []byte("flood")); err != nil {
			t.Fatal(err)
		}
	}
	flushed(t, a)
	eventually(t, func() bool { return violated(&errs, made) })
	if got := streamMsgs(t, m); got != before+1 {
		t.Fatalf("the streams hold %d messages, want %d: only the known kind is stored", got, before+1)
	}
}

// TestPodOfAnotherNamespaceIsAnotherPod: attacker/pod-b, a pod of the same name as
// default/pod-b in a namespace the attacker may create pods in, gets nothing of
// default/pod-b's (renew commands, sign replies, anchors) and cannot speak for it
// (sign requests, events, anchors), while both keep doing their own work.
func TestPodOfAnotherNamespaceIsAnotherPod(t *testing.T) {
	m := newMesh(t)
	var errs bustest.Errors
	victim := m.pod(t, "default/pod-b", nil)
	evil := m.pod(t, "attacker/pod-b", &errs)
	rotator := m.Conn(t, policy.Rotator, nil)

	renewV, _ := events.PodRenewSubject(ref("default/pod-b"))
	anchorsV, _ := events.PodAnchorsSubject(ref("default/pod-b"))
	signV, _ := events.PodSignSubject(ref("default/pod-b"))
	downV, _ := events.PodEventSubject(ref("default/pod-b"), events.PodEventDown)
	renewE, _ := events.PodRenewSubject(ref("attacker/pod-b"))
	signE, _ := events.PodSignSubject(ref("attacker/pod-b"))
	inboxV := policy.Inbox(policy.Pod, ref("default/pod-b")) + ".>"

	stolenRenew := counter(t, evil, renewV)
	stolenAnchors := counter(t, evil, anchorsV)
	stolenInbox := counter(t, evil, inboxV)
	stolenAll := counter(t, evil, "meshagent.pod.*.pod-b.>")
	ownRenew := counter(t, evil, renewE)
	victimRenew := counter(t, victim, renewV)
	victimAnchors := counter(t, victim, anchorsV)
	flushed(t, evil, victim)

	// The rotator renews both, the victim signs and publishes its anchors.
	for _, s := range []string{renewV, renewE} {
		if err := rotator.Publish(s, []byte("renew")); err != nil {
			t.Fatal(err)
		}
	}
	if got := request(t, victim, signV); got != "signed for default/pod-b" {
		t.Fatalf("victim's sign reply %q", got)
	}
	if err := victim.Publish(anchorsV, []byte("own anchors")); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return victimRenew.Load() == 1 && ownRenew.Load() == 1 && victimAnchors.Load() == 1 })

	// The attacker speaks for its namesake.
	before := streamMsgs(t, m)
	for _, s := range []string{signV, anchorsV, downV} {
		if err := evil.Publish(s, []byte("forged")); err != nil {
			t.Fatal(err)
		}
	}
	flushed(t, evil)
	if got := request(t, evil, signE); got != "signed for attacker/pod-b" {
		t.Fatalf("attacker's own sign reply %q", got)
	}
	if n := stolenRenew.Load() + stolenAnchors.Load() + stolenInbox.Load() + stolenAll.Load(); n != 0 {
		t.Fatalf("attacker/pod-b received %d messages meant for default/pod-b", n)
	}
	if got := m.signed["default/pod-b"].Load(); got != 1 {
		t.Fatalf("signer saw %d sign requests for default/pod-b, want only its own", got)
	}
	if got := m.signed["attacker/pod-b"].Load(); got != 1 {
		t.Fatalf("signer saw %d sign requests for attacker/pod-b, want 1", got)
	}
	if victimAnchors.Load() != 1 || victimRenew.Load() != 1 {
		t.Fatalf("default/pod-b received the attacker's forgeries: %d anchors, %d renews", victimAnchors.Load(), victimRenew.Load())
	}
	if got := streamMsgs(t, m); got != before {
		t.Fatalf("stream grew from %d to %d on the attacker's pod.down", before, got)
	}
	for _, s := range []string{renewV, anchorsV, inboxV, signV, downV} {
		if !violated(&errs, s) {
			t.Errorf("no permission violation reported for %s; got %v", s, errs.All())
		}
	}
}

// TestRotatorCannotSignOrTouchCA: the rotator reads schedules, not keys.
func TestRotatorCannotSignOrTouchCA(t *testing.T) {
	m := newMesh(t)
	var errs bustest.Errors
	r := m.Conn(t, policy.Rotator, &errs)
	short, cancel := contextTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	if _, err := bustest.JetStream(t, r).KeyValue(short, policy.BucketCA); err == nil {
		t.Fatal("rotator opened the CA bucket")
	}
	answered := counter(t, r, events.SignWildcard)
	flushed(t, r)
	if _, err := r.Request(events.SubjectSignAny, []byte("x"), 300*time.Millisecond); err == nil {
		t.Fatal("rotator had a sign request answered")
	}
	pod := m.pod(t, "pod-a", nil)
	sign, _ := events.PodSignSubject(ref("pod-a"))
	request(t, pod, sign)
	if answered.Load() != 0 || m.signed["any"].Load() != 0 {
		t.Fatal("rotator saw or sent a sign request")
	}
}

// TestConnectRefused: no credential, a wrong one, or a token the callout refuses
// never get a connection.
func TestConnectRefused(t *testing.T) {
	m := newMesh(t)
	url := m.Server.ClientURL()
	cases := []struct {
		name string
		opts []nats.Option
	}{
		{"no credential", nil},
		{"refused token", []nats.Option{nats.Token("not-a-pod")}},
		{"user and password", []nats.Option{nats.UserInfo("admin", "admin")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc, err := nats.Connect(url, append(c.opts, nats.Timeout(3*time.Second))...)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Fatalf("want an authorization violation, got %v", err)
			}
		})
	}
	// An unknown nkey (a seed of another credential set) is refused too.
	other := bustest.SecureServer(t)
	_, err := nats.Connect(url, other.RoleOptions(t, policy.Signer)...)
	if err == nil {
		t.Fatal("a signer key of another credential set connected")
	}
}

// TestPodReconnectsWithRefreshedToken: a pod's bus user expires with its token; the
// server disconnects it, and bus.Connect reconnects with the token file re-read.
func TestPodReconnectsWithRefreshedToken(t *testing.T) {
	s := bustest.SecureServer(t)
	var calls atomic.Int64
	var lastToken atomic.Value
	s.ServeCallout(t, func(token string) (events.PodRef, time.Time, error) {
		calls.Add(1)
		lastToken.Store(token)
		if pod, short := strings.CutPrefix(token, "short:"); short {
			return ref(pod), time.Now().Add(2 * time.Second), nil
		}
		return bustest.PodTokens(token)
	})
	dir := t.TempDir()
	tokenFile := dir + "/token"
	writeFile(t, tokenFile, "short:pod-a")
	nc, cerr := bus.Connect(ctxT(t), bus.Config{URL: s.Server.ClientURL(), TokenFile: tokenFile, InboxPrefix: policy.Inbox(policy.Pod, ref("pod-a")),
		ConnectWait: time.Second}, nullLogger())
	if cerr != nil {
		t.Fatal(cerr)
	}
	defer nc.Close()
	writeFile(t, tokenFile, "pod:pod-a") // the kubelet refreshes the projected token
	eventually(t, func() bool { return nc.Stats().Reconnects >= 1 && nc.IsConnected() })
	// The reconnect was admitted on the refreshed token: the new user is the long one,
	// not another short one that would expire again.
	if tok, _ := lastToken.Load().(string); tok != "pod:pod-a" {
		t.Fatalf("reconnected on token %q, want the refreshed pod:pod-a", tok)
	}
	if !nc.IsConnected() || nc.Stats().Reconnects != 1 {
		t.Fatalf("connected %v after %d reconnects, want 1", nc.IsConnected(), nc.Stats().Reconnects)
	}
	if calls.Load() != 2 {
		t.Fatalf("callout asked %d times, want 2", calls.Load())
	}
	renew, _ := events.PodRenewSubject(ref("pod-a"))
	got := counter(t, nc, renew)
	flushed(t, nc)
	if err := s.Conn(t, policy.Rotator, nil).Publish(renew, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return got.Load() == 1 })
}
