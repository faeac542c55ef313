package main

// Break-in (issue 22, part B): erasing the CA's history with a pod's credential,
// and a pod's credential unbounded — a flood of maximal events, publishing into
// the CA's subjects, oversize messages, connections without end, a ten-year token,
// a certificate far longer than the pod's own. Each attack asserts on state: the
// CA history's first sequence and records, the pods' stream per subject, what the
// callout admitted, the certificate's lifetime.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// auditLifetime and auditMaxConns are the signer's pod limits in this suite: a
// short user lifetime, so that every pod is re-admitted several times during it.
const (
	auditLifetime = 10 * time.Second
	auditMaxConns = 12
)

func TestBreakInAudit(t *testing.T) {
	// The signer reads its flags from the environment too (flags > env > defaults).
	t.Setenv("BUS_POD_USER_LIFETIME", auditLifetime.String())
	t.Setenv("BUS_POD_MAX_CONNECTIONS", fmt.Sprint(auditMaxConns))
	dir := testkit.ShortDir(t)
	r, _ := startStackLogged(t, devstack.Config{Dir: dir, Pods: 2, LeafTTL: 2 * time.Minute})
	h := &auditBreakin{dir: dir, st: &r.Stack, admin: r.Conn()}
	h.audit = jsOfConn(t, h.admin)
	tok, err := readToken(h.podFile(attacker))
	if err != nil {
		t.Fatal(err)
	}
	h.token = tok
	// Every pod has certificates (two cert.issued at least) before the attacks.
	testkit.EventuallyWithin(t, 30*time.Second, "every pod's first certificate recorded", func() bool {
		return h.caInfo(t).State.Msgs >= 2
	})
	t.Run("flood the pod's events", h.floodPodEvents)
	t.Run("publish into the CA history", h.publishIntoCAHistory)
	t.Run("oversize publish", h.oversize)
	t.Run("a certificate longer than the pod's", h.longCertificate)
	t.Run("ten-year token", h.tenYearToken)
	t.Run("connections without end", h.connectionsWithoutEnd)
	t.Run("pods re-admitted and served", h.podsStillServed)
}

type auditBreakin struct {
	dir   string
	st    *stackfile.Stack
	admin *nats.Conn
	audit jetstream.JetStream
	token string // the attacker pod's own token
}

func jsOfConn(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func (h *auditBreakin) podFile(id string) string {
	for _, p := range h.st.Pods {
		if p.ID == id {
			return p.TokenFile
		}
	}
	panic("no pod " + id)
}

// attackerConn connects with the attacker pod's token, reconnecting (and so
// re-admitted) as its own processes do; v collects the server's refusals.
func (h *auditBreakin) attackerConn(t *testing.T, v *violations) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(h.st.NATSURL, nats.Token(h.token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, attackerRef)),
		nats.Name("breakin/audit"), nats.ErrorHandler(v.handler), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.IgnoreAuthErrorAbort(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("the attacker pod's own token: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (h *auditBreakin) stream(t *testing.T, name string) jetstream.Stream {
	t.Helper()
	s, err := h.audit.Stream(ctxT(t, 5*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (h *auditBreakin) caInfo(t *testing.T) *jetstream.StreamInfo {
	t.Helper()
	info, err := h.stream(t, events.StreamEvents).Info(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// caRecords are the event ids of every record of the CA's history, by sequence.
func (h *auditBreakin) caRecords(t *testing.T) map[uint64]string {
	t.Helper()
	s := h.stream(t, events.StreamEvents)
	info := h.caInfo(t)
	out := map[uint64]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctxT(t, 5*time.Second), seq)
		if err != nil {
			t.Fatalf("CA record %d: %v", seq, err)
		}
		out[seq] = m.Header.Get(events.HeaderID)
	}
	return out
}

// requireCAHistoryKept fails unless every record of before is still held, at the
// same sequence, and the stream's first sequence has not moved.
func (h *auditBreakin) requireCAHistoryKept(t *testing.T, first uint64, before map[uint64]string) {
	t.Helper()
	if got := h.caInfo(t).State.FirstSeq; got != first {
		t.Fatalf("the CA history's first sequence moved from %d to %d", first, got)
	}
	after := h.caRecords(t)
	for seq, id := range before {
		if after[seq] != id {
			t.Fatalf("CA record %d was %s, now %q", seq, id, after[seq])
		}
	}
}

// floodPodEvents: the attack of the issue — a pod publishes maximal events on its
// own subjects as fast as it can. The CA's history keeps every record; the pods'
// stream keeps at most its bound per subject; the victim's events stay.
func (h *auditBreakin) floodPodEvents(t *testing.T) {
	first, before := h.caInfo(t).State.FirstSeq, h.caRecords(t)
	if len(before) < 2 {
		t.Fatalf("CA history holds %d records before the flood", len(before))
	}
	pods := h.stream(t, events.StreamPodEvents)
	victimUp, _ := events.PodEventSubject(victimRef, events.PodEventUp)
	victimEvents, _ := events.PodEventsOf(victimRef)
	pinfo, err := pods.Info(ctxT(t, 5*time.Second), jetstream.WithSubjectFilter(victimEvents))
	if err != nil {
		t.Fatal(err)
	}
	victimBefore := pinfo.State.Subjects
	if victimBefore[victimUp] == 0 {
		t.Fatalf("the victim's pod.up is not stored before the flood: %v", victimBefore)
	}
	nc := h.attackerConn(t, &violations{})
	js := jsOfConn(t, nc)
	// 600 × 64 KiB (38 MiB) over eight kinds of its own, as a flood of every kind.
	kinds := []string{events.PodEventUp, events.PodEventDown, events.PodEventSecretPushed, events.PodEventSDSNack,
		events.PodEventXDSConnected, events.PodEventXDSNack, events.PodEventEnvoyReady, events.PodEventCertExpiring}
	body := make([]byte, events.MaxEventSize-1024) // the largest the stream stores, with its headers
	for i := range 600 {
		subj, _ := events.PodEventSubject(attackerRef, kinds[i%len(kinds)])
		m := nats.NewMsg(subj)
		m.Header.Set(events.HeaderID, fmt.Sprint("flood-", i))
		m.Data = body
		if i%50 == 49 {
			// Now and then wait for the stream, as a pod's publisher does.
			if _, err := js.PublishMsg(ctxT(t, 10*time.Second), m); err != nil {
				t.Fatalf("flood event %d: %v", i, err)
			}
			continue
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, nc)
	h.requireCAHistoryKept(t, first, before)
	pinfo, err = pods.Info(ctxT(t, 5*time.Second), jetstream.WithSubjectFilter(events.PodEventsWildcard))
	if err != nil {
		t.Fatal(err)
	}
	for subj, n := range pinfo.State.Subjects {
		if n > bus.DefaultPodEventsMaxMsgsPerSubject {
			t.Errorf("pods' stream holds %d events on %s, bound %d", n, subj, bus.DefaultPodEventsMaxMsgsPerSubject)
		}
	}
	// The flood did reach the stream (75 of each kind): it holds the bound, no more.
	if flooded, _ := events.PodEventSubject(attackerRef, events.PodEventSDSNack); pinfo.State.Subjects[flooded] != bus.DefaultPodEventsMaxMsgsPerSubject {
		t.Errorf("pods' stream holds %d events on %s after the flood, want the bound %d", pinfo.State.Subjects[flooded], flooded, bus.DefaultPodEventsMaxMsgsPerSubject)
	}
	for subj, n := range victimBefore {
		if pinfo.State.Subjects[subj] < n {
			t.Errorf("the victim's %s: %d events before the flood, %d after", subj, n, pinfo.State.Subjects[subj])
		}
	}
	// meshctl events still reads the history from its first record.
	out, err := meshctl(t, "events", "-dir", h.dir, "-type", "cert.issued")
	if err != nil {
		t.Fatalf("meshctl events: %v: %s", err, out)
	}
	if n := strings.Count(out, "cert.issued"); n < len(before)/2 {
		t.Fatalf("meshctl events shows %d cert.issued after the flood:\n%s", n, out)
	}
}

// publishIntoCAHistory: a pod may not publish on any subject of the CA's history.
func (h *auditBreakin) publishIntoCAHistory(t *testing.T) {
	first, before := h.caInfo(t).State.FirstSeq, h.caRecords(t)
	last := h.caInfo(t).State.LastSeq
	v := &violations{}
	nc := h.attackerConn(t, v)
	fed, _ := events.TrustFederatedSubject("evil.example")
	subjects := []string{events.SubjectCertIssued, events.SubjectTrustChanged, events.SubjectRenewSent, fed,
		events.Prefix + ".evt.cert.revoked", events.Prefix + ".evt.rotation.x"}
	for _, s := range subjects {
		m := nats.NewMsg(s)
		m.Header.Set(events.HeaderID, "forged-"+s)
		m.Data = []byte(`{}`)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, nc)
	requireViolations(t, "pod "+attacker, v, subjects...)
	if got := h.caInfo(t).State.LastSeq; got != last {
		t.Fatalf("the CA history moved from %d to %d", last, got)
	}
	h.requireCAHistoryKept(t, first, before)
}

// oversize: a pod event larger than the pods' stream keeps is refused by the
// server and stored nowhere; one larger than the server's max payload is not
// even sent.
func (h *auditBreakin) oversize(t *testing.T) {
	pods := h.stream(t, events.StreamPodEvents)
	info, err := pods.Info(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxMsgSize != bus.DefaultPodEventsMaxMsgSize || info.Config.MaxMsgsPerSubject != bus.DefaultPodEventsMaxMsgsPerSubject {
		t.Fatalf("pods' stream bounds: max message %d, per subject %d", info.Config.MaxMsgSize, info.Config.MaxMsgsPerSubject)
	}
	last := info.State.LastSeq
	nc := h.attackerConn(t, &violations{})
	subj, _ := events.PodEventSubject(attackerRef, events.PodEventUp)
	m := nats.NewMsg(subj)
	m.Header.Set(events.HeaderID, "oversize")
	m.Data = make([]byte, 100<<10)
	if _, err := jsOfConn(t, nc).PublishMsg(ctxT(t, 10*time.Second), m); err == nil {
		t.Fatal("a 100 KiB pod event was stored")
	}
	m.Data = make([]byte, 2<<20)
	if err := nc.PublishMsg(m); !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("a 2 MiB publish: %v, want the server's max payload", err)
	}
	flush(t, nc)
	info, err = pods.Info(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != last {
		t.Fatalf("the pods' stream moved from %d to %d", last, info.State.LastSeq)
	}
}

// longCertificate: a pod whose own TTL is 2 minutes asks for 2159 h; it gets at
// most the pods' cap (-pod-max-ttl, by default -default-ttl: 24 h), and the signer
// counts the clamp.
func (h *auditBreakin) longCertificate(t *testing.T) {
	const clamped = `meshagent_signer_ttl_clamped_total{transport="nats"}`
	before := metric(t, h.st.Signer.HTTP, clamped)
	nc := h.attackerConn(t, &violations{})
	subj, err := events.IdentitySignSubject(attackerRef, "demo")
	if err != nil {
		t.Fatal(err)
	}
	reply, err := request[events.SignReply](t, nc, subj, events.SignRequest{CSR: newCSR(t, "spiffe://cluster.local/ns/default/sa/demo"), Token: h.token, TTL: 2159 * time.Hour})
	if err != nil || reply.Error != nil || len(reply.CertChain) == 0 {
		t.Fatalf("sign: %v %v", err, reply.Error)
	}
	chain, err := pki.ParseCertsPEM([]byte(strings.Join(reply.CertChain, "")))
	if err != nil {
		t.Fatal(err)
	}
	if life := chain[0].NotAfter.Sub(chain[0].NotBefore); life > 24*time.Hour+time.Minute {
		t.Fatalf("the pod got a %s certificate, cap 24h", life)
	}
	if got := metric(t, h.st.Signer.HTTP, clamped); got != before+1 {
		t.Fatalf("%s = %v, want %v", clamped, got, before+1)
	}
}

// tenYearToken: a token valid for ten years gives a bus user that expires within
// the lifetime cap: the server disconnects it then.
func (h *auditBreakin) tenYearToken(t *testing.T) {
	iss, err := devtoken.Load(h.dir + "/issuer")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := iss.MintForPod("default", "demo", attacker, h.st.TokenIssuer.Audience, 10*365*24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var closed atomic.Int64
	start := time.Now()
	nc, err := nats.Connect(h.st.NATSURL, nats.Token(tok), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, attackerRef)),
		nats.MaxReconnects(0), nats.Timeout(5*time.Second), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
		nats.ClosedHandler(func(*nats.Conn) { closed.Store(int64(time.Since(start))) }))
	if err != nil {
		t.Fatalf("ten-year token refused: %v", err)
	}
	defer nc.Close()
	testkit.EventuallyWithin(t, auditLifetime+5*time.Second, "the ten-year token's bus user expired", func() bool { return closed.Load() > 0 })
	if lived := time.Duration(closed.Load()); lived > auditLifetime+time.Second {
		t.Fatalf("the user lived %s, cap %s", lived, auditLifetime)
	}
}

// connectionsWithoutEnd: connections on one pod's token beyond the bound are
// refused, by name, and the pod then holds no more than the bound.
func (h *auditBreakin) connectionsWithoutEnd(t *testing.T) {
	const series = `meshagent_signer_bus_callout_refused_total{reason="too_many_connections"}`
	before := metric(t, h.st.Signer.HTTP, series)
	var admitted []*nats.Conn
	defer func() {
		for _, nc := range admitted {
			nc.Close()
		}
	}()
	refused := 0
	for range auditMaxConns + 5 {
		nc, err := nats.Connect(h.st.NATSURL, nats.Token(h.token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, attackerRef)),
			nats.MaxReconnects(0), nats.Timeout(5*time.Second))
		if err != nil {
			refused++
			continue
		}
		admitted = append(admitted, nc)
	}
	if refused == 0 || len(admitted) > auditMaxConns {
		t.Fatalf("%d connections admitted on one token, %d refused; bound %d", len(admitted), refused, auditMaxConns)
	}
	if got := metric(t, h.st.Signer.HTTP, series); got != before+float64(refused) {
		t.Fatalf("%s = %v, want %v", series, got, before+float64(refused))
	}
	logs, err := filepath.Glob(filepath.Join(h.dir, "logs", "signer*.log"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("signer log: %v", err)
	}
	testkit.EventuallyWithin(t, 30*time.Second, "the refusal named in the signer's log", func() bool {
		b, _ := os.ReadFile(logs[0])
		return strings.Contains(string(b), "reason=too_many_connections")
	})
}

// podsStillServed: after the pods' users expired (and were admitted again) at
// least twice each, both pods are on the bus with their rights: a forced renewal
// reaches each and each signs a new certificate over the bus.
func (h *auditBreakin) podsStillServed(t *testing.T) {
	const admitted = `meshagent_signer_bus_callout_admitted_total`
	from := metric(t, h.st.Signer.HTTP, admitted)
	testkit.EventuallyWithin(t, 3*auditLifetime+5*time.Second, "the pods' users expired and were admitted again twice", func() bool {
		return metric(t, h.st.Signer.HTTP, admitted) >= from+4
	})
	last := h.caInfo(t).State.LastSeq
	// A renew command reaches a pod only while it is connected, and the attacker pod
	// may be waiting out the connection bound it used up: send again now and then.
	sent := map[events.PodRef]time.Time{}
	testkit.EventuallyWithin(t, 30*time.Second, "both pods renewed over the bus", func() bool {
		s := h.stream(t, events.StreamEvents)
		seen := map[events.PodRef]bool{}
		info := h.caInfo(t)
		for seq := last + 1; seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctxT(t, 5*time.Second), seq)
			if err != nil || m.Subject != events.SubjectCertIssued {
				continue
			}
			ev, _, err := events.Decode[events.CertIssued](&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
			if err == nil {
				seen[ev.Pod] = true
			}
		}
		for _, pod := range []events.PodRef{victimRef, attackerRef} {
			if !seen[pod] && time.Since(sent[pod]) > 2*time.Second {
				subj, _ := events.PodRenewSubject(pod)
				publish(t, h.admin, subj, events.RenewDue{Pod: pod, Resource: "default", Reason: events.RenewForced})
				sent[pod] = time.Now()
			}
		}
		return seen[victimRef] && seen[attackerRef]
	})
}
