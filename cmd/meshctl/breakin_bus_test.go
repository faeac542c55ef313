package main

// Break-in: connecting, reading CA state, answering sign requests, speaking for
// another pod and lying to the rotator over the bus.

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// noCredential: without a credential the server admits nobody, so no attack below
// can even start; the callout counts each refusal.
func (h *breakin) noCredential(t *testing.T) {
	httpAddr, _, refusal := h.admission()
	refused := refusal("no_token")
	before := metric(t, httpAddr, refused)
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	cases := map[string][]nats.Option{
		"nothing":                          nil,
		"user and password":                {nats.UserInfo("admin", "admin")},
		"an nkey the server does not know": {nats.Nkey(pub, kp.Sign)},
	}
	for name, opts := range cases {
		// The hub, and on a node tier the attacker's node too.
		for _, url := range slices.Compact([]string{h.st.NATSURL, h.podURL()}) {
			nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second), nats.MaxReconnects(0))...)
			if err == nil {
				nc.Close()
				t.Errorf("%s: connected to %s", name, url)
			}
		}
	}
	testkit.EventuallyWithin(t, 30*time.Second, fmt.Sprintf("the callout did not count the refusals (%s was %v)", refused, before), func() bool { return metric(t, httpAddr, refused) >= before+2 })
}

// badTokens: expired, foreign, not pod-bound, wrong audience or garbage tokens are
// refused at connect, and nobody is admitted.
func (h *breakin) badTokens(t *testing.T) {
	foreign, err := devtoken.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	aud := h.st.TokenIssuer.Audience
	mint := func(tok string, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	cases := []struct{ name, token, reason string }{
		{"expired", mint(h.iss.MintForPod("default", "demo", victim, aud, time.Hour, now.Add(-2*time.Hour))), "bad_token"},
		{"foreign issuer", mint(foreign.MintForPod("default", "demo", victim, aud, time.Hour, now)), "bad_token"},
		{"wrong audience", mint(h.iss.MintForPod("default", "demo", victim, "evil", time.Hour, now)), "bad_token"},
		{"garbage", "not-a-jwt", "bad_token"},
		{"no pod claim", mint(h.iss.Mint("default", "demo", aud, time.Hour, now)), "not_pod_bound"},
	}
	if n := h.podNode(); n != nil {
		// On a node tier: the victim's real token, bound to its own node, through
		// the attacker's node.
		if victimNode := h.podInfo(victim).Node; victimNode != n.Name {
			cases = append(cases, struct{ name, token, reason string }{"another node's pod",
				mint(h.iss.MintForPodOnNode("default", "demo", victim, victimNode, aud, time.Hour, now)), "node"})
		}
	}
	httpAddr, admitted, refusal := h.admission()
	admittedBefore := metric(t, httpAddr, admitted)
	want := map[string]float64{}
	for _, c := range cases {
		series := refusal(c.reason)
		if _, ok := want[series]; !ok {
			want[series] = metric(t, httpAddr, series)
		}
		want[series]++
		t.Run(c.name, func(t *testing.T) {
			if nc, err := h.connToken(t, c.token, victimRef, nil); err == nil {
				nc.Close()
				t.Fatal("connected")
			}
		})
	}
	for series, n := range want {
		testkit.EventuallyWithin(t, 30*time.Second, fmt.Sprintf("%s did not reach %v", series, n), func() bool { return metric(t, httpAddr, series) >= n })
	}
	if got := metric(t, httpAddr, admitted); got != admittedBefore {
		t.Fatalf("the callout admitted %v connections during the attack", got-admittedBefore)
	}
}

// attempt is one request an attacker makes; all of them must fail.
type attempt struct {
	subject string
	body    string
}

// tryAll sends every attempt from nc at once (a refused publish gets no answer, so
// each waits out its timeout) and fails the test for each that was answered.
func tryAll(t *testing.T, who string, nc *nats.Conn, attempts []attempt) {
	t.Helper()
	var wg sync.WaitGroup
	answered := make([]string, len(attempts))
	for i, a := range attempts {
		wg.Go(func() {
			if resp, err := nc.Request(a.subject, []byte(a.body), time.Second); err == nil {
				answered[i] = string(resp.Data)
			}
		})
	}
	wg.Wait()
	for i, a := range attempts {
		if answered[i] != "" {
			t.Errorf("%s: %s was answered: %.200s", who, a.subject, answered[i])
		}
	}
}

// readCAKey: neither audit nor a pod can look up, read, watch, copy, overwrite or
// delete the CA bucket, whatever JetStream API they use.
func (h *breakin) readCAKey(t *testing.T) {
	ca := "KV_" + policy.BucketCA
	key := "$KV." + policy.BucketCA + "." + "root"
	before := h.caState(t)
	for _, who := range []struct {
		name string
		nc   *nats.Conn
		v    *violations
	}{{"audit", h.audit, h.auditErrs}, {"pod", h.pod, h.podErrs}} {
		t.Run(who.name, func(t *testing.T) {
			// A push consumer would deliver into the attacker's own inbox, which it may read.
			inbox := who.nc.NewInbox()
			thief := listen(t, who.name, who.nc, inbox+".>", "")
			flush(t, who.nc)
			if _, err := h.jsOf(t, who.nc).KeyValue(ctxT(t, time.Second), policy.BucketCA); err == nil {
				t.Error("opened the CA bucket")
			}
			attempts := []attempt{
				{"$JS.API.STREAM.INFO." + ca, ""},
				{"$JS.API.STREAM.MSG.GET." + ca, `{"last_by_subj":"` + key + `"}`},
				{"$JS.API.DIRECT.GET." + ca, `{"last_by_subj":"` + key + `"}`},
				{"$JS.API.DIRECT.GET." + ca + "." + key, ""},
				{"$JS.API.CONSUMER.CREATE." + ca, `{"stream_name":"` + ca + `","config":{"deliver_policy":"all","ack_policy":"none","deliver_subject":"` + inbox + `.c"}}`},
				{"$JS.API.CONSUMER.CREATE." + ca + ".thief." + key, `{"stream_name":"` + ca + `","config":{"name":"thief","deliver_policy":"all","ack_policy":"none","filter_subject":"` + key + `"}}`},
				{"$JS.API.CONSUMER.DURABLE.CREATE." + ca + ".thief", `{"stream_name":"` + ca + `","config":{"durable_name":"thief","deliver_policy":"all","ack_policy":"none","deliver_subject":"` + inbox + `.d"}}`},
				{"$JS.API.STREAM.CREATE.STOLEN", `{"name":"STOLEN","storage":"memory","sources":[{"name":"` + ca + `"}]}`},
				{"$JS.API.STREAM.UPDATE." + events.StreamEvents, `{"name":"` + events.StreamEvents + `","subjects":["meshagent.evt.>"],"sources":[{"name":"` + ca + `"}]}`},
				{"$JS.API.STREAM.PURGE." + ca, ""},
				{"$JS.API.STREAM.DELETE." + ca, ""},
				{key, "overwritten"},
			}
			tryAll(t, who.name, who.nc, attempts)
			var subjects []string
			for _, a := range attempts {
				subjects = append(subjects, a.subject)
			}
			requireViolations(t, who.name, who.v, subjects...)
			flush(t, who.nc)
			if n := thief.got.Load(); n != 0 {
				t.Errorf("a consumer delivered %d CA records to the attacker's inbox", n)
			}
		})
	}
	if after := h.caState(t); after != before {
		t.Fatalf("the CA bucket moved from sequence %d to %d", before, after)
	}
}

// answerSignRequests: nobody but the signer may listen to sign requests (they carry
// tokens) or answer them; the victim still renews under the genuine root.
func (h *breakin) answerSignRequests(t *testing.T) {
	victimSign := h.signSubject(victimRef)
	for _, who := range []struct {
		name string
		nc   *nats.Conn
	}{{"audit", h.audit}, {"pod", h.pod}} {
		h.listening = append(h.listening,
			listen(t, who.name, who.nc, victimSign, events.SignerQueue),
			listen(t, who.name, who.nc, victimSign, ""),
			listen(t, who.name, who.nc, events.SubjectSignAny, events.SignerQueue))
	}
	flush(t, h.audit, h.pod)
	requireViolations(t, "audit", h.auditErrs, events.SignWildcard, victimSign, events.SubjectSignAny)
	requireViolations(t, "pod", h.podErrs, events.SignWildcard, victimSign, events.SubjectSignAny)

	rejected := `meshagent_sds_edge_trust_rejected_total{source="sign-reply"}`
	edge := h.podInfo(victim).HTTP["sds-edge"]
	rejectedBefore := metric(t, edge, rejected)
	before := h.serving(t, victim)
	if out, err := meshctl(t, "rotate", "-dir", h.dir, "pod", victim); err != nil {
		t.Fatalf("forced renewal: %v\n%s", err, out)
	}
	var now served
	testkit.EventuallyWithin(t, 30*time.Second, fmt.Sprintf("%s was not renewed", victim), func() bool { now = h.serving(t, victim); return now.serial != before.serial })
	if !h.inBundle(t, now.root) {
		t.Fatalf("%s's new leaf chains to %s, not to a root of the signer's bundle", victim, now.root)
	}
	if got := metric(t, edge, rejected); got != rejectedBefore {
		t.Fatalf("sds-edge refused %v sign replies: someone else answered", got-rejectedBefore)
	}
}

func (h *breakin) inBundle(t *testing.T, fingerprint string) bool {
	t.Helper()
	for _, r := range h.bundle(t).Roots {
		c, err := pki.ParseCertsPEM([]byte(r))
		if err != nil {
			t.Fatal(err)
		}
		if pki.Fingerprint(c[0]) == fingerprint {
			return true
		}
	}
	return false
}

// signSubject is where the attacker's connection would send pod's sign requests:
// on a node tier, its own node's subject for pod (the only node it can send on).
func (h *breakin) signSubject(pod events.PodRef) string {
	if n := h.podNode(); n != nil {
		s, _ := events.NodeSignSubject(n.Name, pod)
		return s
	}
	s, _ := events.PodSignSubject(pod)
	return s
}

// otherPods: demo-1, with its own token, cannot sign, renew, report or publish
// anchors as demo-0, and a token stolen from demo-0 does not make demo-1's requests
// demo-0's.
func (h *breakin) otherPods(t *testing.T) {
	victimSign, attackerSign := h.signSubject(victimRef), h.signSubject(attackerRef)
	victimRenew, _ := events.PodRenewSubject(victimRef)
	victimAnchors, _ := events.PodAnchorsSubject(victimRef)
	issued := h.stored(t, events.SubjectCertIssued)
	received := metric(t, h.st.Signer.HTTP, `meshagent_signer_csr_received_total{transport="nats"}`)
	before := h.serving(t, victim)

	_, evilRoot := newCA(t, "cluster.local")
	publish(t, h.pod, victimAnchors, events.TrustAnchors{Pod: victimRef, Roots: []string{string(pki.EncodeCertPEM(evilRoot))}})
	publish(t, h.pod, victimRenew, events.RenewDue{Pod: victimRef, Resource: "default", Reason: events.RenewForced})
	victimTok, err := readToken(h.podInfo(victim).TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	csr := newCSR(t, "spiffe://cluster.local/ns/default/sa/demo")
	publish(t, h.pod, victimSign, events.SignRequest{CSR: csr, Token: victimTok, Pod: victimRef})
	flush(t, h.pod)
	requireViolations(t, "pod", h.podErrs, victimAnchors, victimRenew, victimSign)

	// demo-0's token, on demo-1's own sign subject: the signer sees demo-1's subject
	// and demo-0's token and refuses.
	for _, p := range []events.PodRef{{}, victimRef} {
		reply, err := request[events.SignReply](t, h.pod, attackerSign, events.SignRequest{CSR: csr, Token: victimTok, Pod: p})
		if err != nil {
			t.Fatal(err)
		}
		if reply.Error == nil || reply.Error.Code != events.CodePermissionDenied {
			t.Fatalf("demo-0's token on demo-1's subject (pod %q): %+v", p, reply.Error)
		}
	}
	if got := h.stored(t, events.SubjectCertIssued); got != issued {
		t.Fatalf("%d certificates were issued during the attack", got-issued)
	}
	if got := metric(t, h.st.Signer.HTTP, `meshagent_signer_csr_received_total{transport="nats"}`); got != received+2 {
		t.Fatalf("the signer received %v requests, want only the 2 on demo-1's own subject", got-received)
	}
	after := h.serving(t, victim)
	if after.serial != before.serial || !sameSet(after.rootCA, before.rootCA) {
		t.Fatalf("demo-0 changed: %+v -> %+v", before, after)
	}
}

// lieToRotator: nobody but demo-0 can say demo-0 is gone, and nobody but the signer
// can record a certificate; the rotator checks what the bus lets through.
func (h *breakin) lieToRotator(t *testing.T) {
	rot := h.st.Rotator.HTTP
	scheduled := metric(t, rot, "meshagent_rotator_scheduled")
	if scheduled < 2 {
		t.Fatalf("meshagent_rotator_scheduled is %v before the attack, want both pods", scheduled)
	}
	retired := `meshagent_rotator_events_total{kind="pod.down",result="retired"}`
	rejected := `meshagent_rotator_events_total{kind="pod.down",result="rejected"}`
	retiredBefore, rejectedBefore := metric(t, rot, retired), metric(t, rot, rejected)
	victimDown, _ := events.PodEventSubject(victimRef, events.PodEventDown)
	attackerDown, _ := events.PodEventSubject(attackerRef, events.PodEventDown)
	downs := h.stored(t, victimDown)
	issued := h.stored(t, events.SubjectCertIssued)

	forged := h.forgedRecord(t, victimRef)
	for _, who := range []struct {
		name string
		nc   *nats.Conn
		v    *violations
	}{{"audit", h.audit, h.auditErrs}, {"pod", h.pod, h.podErrs}} {
		publish(t, who.nc, victimDown, events.PodDown{Pod: victimRef, Reason: "deleted"})
		publish(t, who.nc, events.SubjectCertIssued, forged)
		flush(t, who.nc)
		requireViolations(t, who.name, who.v, victimDown, events.SubjectCertIssued)
	}
	// demo-1 may report its own pod.down; one that names demo-0 is refused by the rotator.
	publish(t, h.pod, attackerDown, events.PodDown{Pod: victimRef, Reason: "deleted"})
	flush(t, h.pod)
	testkit.EventuallyWithin(t, 10*time.Second, "the rotator did not refuse demo-1's pod.down naming demo-0", func() bool { return metric(t, rot, rejected) == rejectedBefore+1 })
	if got := h.stored(t, victimDown); got != downs {
		t.Fatalf("%d pod.down events for demo-0 were stored", got-downs)
	}
	if got := h.stored(t, events.SubjectCertIssued); got != issued {
		t.Fatalf("%d cert.issued records were stored", got-issued)
	}
	if metric(t, rot, retired) != retiredBefore || metric(t, rot, "meshagent_rotator_scheduled") != scheduled {
		t.Fatal("the rotator retired or dropped an entry")
	}
	// Whether it still renews demo-0 on schedule is seen at the next root rotation
	// (forgeTrustChanged).
}

// forgedRecord is a cert.issued for pod under an attacker's CA, valid for a year,
// which would put off the pod's renewal if believed.
func (h *breakin) forgedRecord(t *testing.T, pod events.PodRef) events.CertIssued {
	key, root := newCA(t, "cluster.local")
	leaf := newLeaf(t, key, root, "spiffe://cluster.local/ns/default/sa/demo", 365*24*time.Hour)
	return events.CertIssued{
		Serial: pki.SerialHex(leaf), SPIFFEID: "spiffe://cluster.local/ns/default/sa/demo",
		NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, Pod: pod, Resource: "default",
		KeyAlgorithm: string(pki.ECP256), AuthSource: "jwt", Signer: "signer-0",
		RootFingerprint: pki.Fingerprint(root), CertChain: []string{string(pki.EncodeCertPEM(leaf))},
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}

// heardNothing: none of the attackers' subscriptions, open for the whole run,
// received a message, and the server refused each.
func (h *breakin) heardNothing(t *testing.T) {
	flush(t, h.audit, h.pod)
	for _, l := range h.listening {
		if n := l.got.Load(); n != 0 {
			t.Errorf("%s heard %d messages on %s (queue %q), first on %v", l.who, n, l.subject, l.queue, l.first.Load())
		}
		v := h.auditErrs
		if l.who != "audit" {
			v = h.podErrs
		}
		if !v.saw(l.subject) {
			t.Errorf("%s: no permission violation for subscription to %s", l.who, l.subject)
		}
	}
}
