package signer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
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
