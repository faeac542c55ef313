package signer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/natsapi"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// TestRepliesGoOnlyToInboxes: a request's reply subject is the requester's choice,
// and the signer may publish into its CA bucket and its events. A request whose reply
// names one of those (or the signer's own inbox) is dropped: nothing is written there,
// no certificate is issued, no rotation happens; a request with an inbox still works.
func TestRepliesGoOnlyToInboxes(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("signer-a")
	// The signer logs each request it drops, in the subscription's callback, before
	// anything else could happen for it: the log says when every one was handled.
	logs := &testkit.Buffer{}
	s := e.build(t, cfg, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn}))
	s.run(t)
	testkit.Eventually(t, "signer ready", func() bool { return s.ready() == nil })
	const dropped = "request dropped: its reply subject is no requester's inbox"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	caStream, err := e.js.Stream(ctx, "KV_"+cfg.CA.KVBucket)
	if err != nil {
		t.Fatal(err)
	}
	caSeq := func() uint64 {
		info, err := caStream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	before, gen := caSeq(), bundle(t, e.nc).Generation
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	requests := []struct {
		subject string
		p       events.Payload
	}{
		{events.SubjectTrustBundle, events.BundleRequest{}},
		{events.SubjectSignAny, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")}},
		{events.SubjectRootRotate, events.RotateRequest{}},
	}
	replies := []string{"$KV." + cfg.CA.KVBucket + ".root", events.SubjectTrustChanged, events.SubjectCertIssued,
		"$JS.API.STREAM.UPDATE." + events.StreamEvents, "_INBOX.signer.x"}
	for _, reply := range replies {
		for _, r := range requests {
			m, err := events.NewMsgOn(r.subject, "test", r.p)
			if err != nil {
				t.Fatal(err)
			}
			m.Reply = reply
			if err := e.nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := len(replies) * len(requests)
	testkit.Eventually(t, "every request dropped", func() bool { return strings.Count(logs.String(), dropped) >= want })
	if n := strings.Count(logs.String(), dropped); n != want {
		t.Fatalf("%d requests dropped, want %d", n, want)
	}
	if got := caSeq(); got != before {
		t.Fatalf("the CA bucket moved from sequence %d to %d", before, got)
	}
	if got := bundle(t, e.nc).Generation; got != gen {
		t.Fatalf("the root rotated: generation %d -> %d", gen, got)
	}
	for _, s := range []string{events.SubjectTrustChanged, events.SubjectCertIssued} {
		if n := count(t, e.js, s); n != 0 {
			t.Fatalf("%d messages on %s", n, s)
		}
	}
	if rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")}); rep.Error != nil {
		t.Fatalf("a request with an inbox: %v", rep.Error)
	}
}

// TestRepliesGoOnlyToTheRequestersInbox: nats-server checks the subject a client
// publishes on, not the reply subject it names, so a pod's request on its own sign
// subject could name another pod's inbox, and the signer published its answer
// there. A pod sign subject (pod, identity, to a replica by name) is answered only
// in that pod's inbox, SubjectSignAny and SubjectRootRotate (the admin's) in no
// pod's; the others are counted, logged below error, and nothing reaches the
// victim. The attacker's own inbox still gets its answer (the positive control).
func TestRepliesGoOnlyToTheRequestersInbox(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("signer-a")
	logs := &testkit.Buffer{}
	s := e.build(t, cfg, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}))
	s.run(t)
	testkit.Eventually(t, "signer ready", func() bool { return s.ready() == nil })
	attacker, victim := shopPod("attacker"), shopPod("victim")
	victimInbox := "_INBOX.pod.shop.victim.x"
	seen, err := e.nc.SubscribeSync(victimInbox)
	if err != nil {
		t.Fatal(err)
	}
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	req := events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")}
	podSubject, _ := events.PodSignSubject(attacker)
	idSubject, _ := events.IdentitySignSubject(attacker, "web")
	replicaSubject, _ := events.ReplicaSignSubject(natsapi.ReplicaName(cfg.Instance), podSubject)
	nodeSubject, _ := events.NodeSignSubject("node-a", attacker)
	attacks := []string{podSubject, idSubject, replicaSubject, nodeSubject, events.SubjectSignAny}
	for _, subject := range attacks {
		m, err := events.NewSignRequestMsg(subject, events.EncodingCompact, "test", req)
		if err != nil {
			t.Fatal(err)
		}
		m.Reply = victimInbox
		if err := e.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	rot, err := events.NewMsgOn(events.SubjectRootRotate, "test", events.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rot.Reply = victimInbox
	if err := e.nc.PublishMsg(rot); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("meshagent_signer_nats_replies_refused_total %d", len(attacks)+1)
	testkit.Eventually(t, "every misdirected request refused", func() bool {
		return strings.Contains(s.metrics(t), want)
	})
	// The positive control: the attacker's own inbox is answered, on each form of
	// its sign subject.
	own, err := e.nc.SubscribeSync("_INBOX.pod.shop.attacker.>")
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range attacks[:4] {
		m, _ := events.NewSignRequestMsg(subject, events.EncodingCompact, "test", req)
		m.Reply = "_INBOX.pod.shop.attacker." + nats.NewInbox()[len("_INBOX."):]
		if err := e.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if _, err := own.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("no answer in the requester's own inbox on %s: %v", subject, err)
		}
	}
	if _, err := seen.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("the signer answered into %s's inbox", victim)
	}
	if strings.Contains(logs.String(), "[ERROR]") {
		t.Fatalf("a refused reply was logged as an error:\n%s", logs)
	}
	if n := count(t, e.js, events.SubjectTrustChanged); n != 0 {
		t.Fatalf("a misdirected rotation request rotated the root: %d trust.changed", n)
	}
}
