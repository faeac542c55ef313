package signer

import (
	"context"
	"crypto/x509"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"fmt"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// rootOf signs a CSR over NATS and returns the fingerprint of the chain's root.
func rootOf(t *testing.T, e *env, nc *nats.Conn) string {
	t.Helper()
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	rep := natsSign(t, nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), TTL: time.Minute})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	verifyChain(t, rep.CertChain, rep.Roots, e.clock.Now())
	certs := mustCerts(t, rep.CertChain)
	return pki.Fingerprint(certs[len(certs)-1])
}

// announced waits until every replica has announced gen: the writer of the
// change at once, the others once they have given it a moment to go first, on
// their clock, which this moves a little at a time after the writer announced.
func announced(t *testing.T, fake *clock.Fake, gen uint64, replicas ...*replica) {
	t.Helper()
	count := func() (n int) {
		for _, r := range replicas {
			if r.source.Announced() >= gen {
				n++
			}
		}
		return n
	}
	testkit.EventuallyWithin(t, 10*time.Second, fmt.Sprintf("the writer announced gen %d", gen), func() bool { return count() >= 1 })
	testkit.EventuallyWithin(t, 10*time.Second, fmt.Sprintf("every replica announced gen %d", gen), func() bool {
		fake.Add(250 * time.Millisecond)
		return count() == len(replicas)
	})
}

func TestRootRotationAcrossReplicas(t *testing.T) {
	e := newEnv(t)
	fake := clock.NewFake(time.Now())
	e.clock = fake
	cfg := func(name string) (c config.Config) {
		c = e.config(name)
		c.CA.RootTTL = 10 * time.Minute
		c.CA.CheckInterval = 20 * time.Millisecond
		c.CA.RotateMinInterval = 30 * time.Second
		return c
	}
	a := e.start(t, cfg("signer-a"))
	b := e.start(t, cfg("signer-b"))
	// What pods hear: the subject itself, not the stream's deduplicated copy.
	var heard atomic.Int32
	sub, err := e.nc.Subscribe(events.SubjectTrustChanged, func(*nats.Msg) { heard.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	old := bundle(t, e.nc)
	if a.auth.Current().RootFingerprint() != b.auth.Current().RootFingerprint() {
		t.Fatal("replicas on different roots")
	}
	oldFP := a.auth.Current().RootFingerprint()

	// 10% of the root's life left: the periodic check rotates, once, fleet-wide.
	fake.Add(9 * time.Minute)
	testkit.EventuallyWithin(t, 10*time.Second, "both replicas on the new root", func() bool {
		return a.auth.Current().Generation == 2 && b.auth.Current().Generation == 2
	})
	newFP := a.auth.Current().RootFingerprint()
	if newFP == oldFP || b.auth.Current().RootFingerprint() != newFP {
		t.Fatal("no new root")
	}
	testkit.EventuallyWithin(t, 30*time.Second, "trust.changed", func() bool { return count(t, e.js, events.SubjectTrustChanged) >= 1 })
	tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged)
	if tc.Reason != events.TrustReasonRotation || tc.Generation != 2 || len(tc.Roots) != 2 || tc.Added[0] != newFP {
		t.Fatalf("trust.changed %+v", tc)
	}
	nb := bundle(t, e.nc)
	if nb.Generation != 2 || len(nb.Roots) != 2 || nb.Roots[1] != old.Roots[0] {
		t.Fatalf("bundle after rotation: gen %d, %d roots", nb.Generation, len(nb.Roots))
	}
	// Whichever replica answers, it signs with the new root.
	for range 6 {
		if fp := rootOf(t, e, e.nc); fp != newFP {
			t.Fatalf("signed under %s, want the new root %s", fp, newFP)
		}
	}
	// So does the replica that did not rotate, over gRPC.
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	resp, err := istioCreate(istioClient(t, b, nb.Roots, nil, fake.Now), e.token(t, "shop", "web"), "", csr, 60)
	if err != nil {
		t.Fatal(err)
	}
	if certs := mustCerts(t, resp.CertChain); pki.Fingerprint(certs[len(certs)-1]) != newFP {
		t.Fatal("gRPC chain does not end at the new root")
	}
	// Both replicas announced generation 2 (the writer, and the other on seeing it in
	// KV); JetStream kept one.
	announced(t, fake, 2, a, b)
	if n := count(t, e.js, events.SubjectTrustChanged); n != 1 {
		t.Fatalf("%d trust.changed events for one rotation", n)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := heard.Load(); n != 1 {
		t.Fatalf("pods heard %d trust.changed for one rotation, want 1", n)
	}

	// meshctl rotate root, with a new key, once -root-rotate-min-interval has passed.
	fake.Add(30 * time.Second)
	rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true, Reason: "test"})
	if rr.Error != nil || rr.Fingerprint == newFP || len(rr.Roots) != 3 {
		t.Fatalf("rotate reply %+v (%d roots)", rr.Error, len(rr.Roots))
	}
	testkit.EventuallyWithin(t, 10*time.Second, "both replicas on the forced root", func() bool {
		return a.auth.Current().RootFingerprint() == rr.Fingerprint && b.auth.Current().RootFingerprint() == rr.Fingerprint
	})
	announced(t, fake, 3, a, b)
	if n := count(t, e.js, events.SubjectTrustChanged); n != 2 {
		t.Fatalf("%d trust.changed events, want 2", n)
	}
	// The first root expires and leaves the bundle.
	fake.Add(2 * time.Minute)
	testkit.EventuallyWithin(t, 10*time.Second, "expired root dropped", func() bool {
		return len(a.auth.Current().Roots) == 2 && len(b.auth.Current().Roots) == 2
	})
	testkit.EventuallyWithin(t, 30*time.Second, "trust.changed on expiry", func() bool { return count(t, e.js, events.SubjectTrustChanged) == 3 })
	if tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged); tc.Reason != events.TrustReasonExpired || len(tc.Removed) != 1 || tc.Removed[0] != oldFP {
		t.Fatalf("trust.changed on expiry %+v", tc)
	}
}

func TestPluggedInMode(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	root, inter, dir := pluggedCADir(t, now)
	c := e.config("signer-p")
	c.CA.Dir = dir
	c.CA.ReloadDelay = 20 * time.Millisecond
	s := e.start(t, c)

	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	verifyChain(t, rep.CertChain, rep.Roots, time.Now())
	certs := mustCerts(t, rep.CertChain)
	if len(certs) != 3 || !certs[1].Equal(inter.Cert) || !certs[2].Equal(root.Cert) {
		t.Fatalf("chain of %d, want leaf, intermediate, root", len(certs))
	}
	// gRPC: the serving chain carries the intermediate, so trusting the root is enough.
	resp, err := istioCreate(istioClient(t, s, []string{string(pki.EncodeCertPEM(root.Cert))}, nil, nil), e.token(t, "shop", "web"), "", csr, 0)
	if err != nil || len(resp.CertChain) != 3 {
		t.Fatalf("grpc: %v", err)
	}
	if rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{}); rr.Error == nil || rr.Error.Code != events.CodeInvalidArgument {
		t.Fatalf("forced rotation in plugged-in mode: %+v", rr.Error)
	}

	// An invalid replacement (key of another CA) is refused; the old material stays.
	other := testkit.NewCA(t, "other", root, now, 24*time.Hour)
	signertest.WriteCACerts(t, dir, &testkit.CA{Cert: inter.Cert, Key: other.Key}, []*x509.Certificate{root.Cert}, root.Cert)
	plugged := s.source.(*ca.Plugged)
	testkit.EventuallyWithin(t, 10*time.Second, "reload refused", func() bool { return plugged.Rejected() >= 1 })
	if !s.auth.Current().Cert.Equal(inter.Cert) {
		t.Fatal("invalid material installed")
	}
	if rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")}); rep.Error != nil {
		t.Fatalf("signing after an invalid reload: %v", rep.Error)
	}
	if n := count(t, e.js, events.SubjectTrustChanged); n != 0 {
		t.Fatalf("trust.changed after an invalid reload")
	}
	// A new root and intermediate, with both roots in the bundle: unrelated to the
	// current root, refused (pods would refuse it); cross-signed by it, installed.
	root2 := testkit.NewCA(t, "root2", nil, now, 96*time.Hour)
	inter2 := testkit.NewCA(t, "inter2", root2, now, 24*time.Hour)
	signertest.WriteCACerts(t, dir, inter2, []*x509.Certificate{root2.Cert}, root2.Cert, root.Cert)
	testkit.EventuallyWithin(t, 10*time.Second, "root swap refused", func() bool { return plugged.Rejected() >= 2 })
	if !s.auth.Current().Cert.Equal(inter.Cert) || count(t, e.js, events.SubjectTrustChanged) != 0 {
		t.Fatal("a root swap that strands the fleet was installed")
	}
	cross := testkit.CrossSign(t, root2.Cert, root, now, 24*time.Hour)
	signertest.WriteCACerts(t, dir, inter2, []*x509.Certificate{cross, root2.Cert}, root2.Cert, root.Cert)
	testkit.EventuallyWithin(t, 10*time.Second, "reload", func() bool { return s.auth.Current().Cert.Equal(inter2.Cert) })
	testkit.EventuallyWithin(t, 30*time.Second, "trust.changed", func() bool { return count(t, e.js, events.SubjectTrustChanged) == 1 })
	if tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged); tc.Reason != events.TrustReasonReload || len(tc.Roots) != 2 {
		t.Fatalf("trust.changed %+v", tc)
	}
	if fp := rootOf(t, e, e.nc); fp != pki.Fingerprint(root2.Cert) {
		t.Fatal("not signing under the new root")
	}
}

// A trust.changed that JetStream refuses at the moment of rotation is not lost: every
// replica that saw the new generation keeps retrying it, and once the stream takes
// messages again it holds the event exactly once.
func TestTrustChangedSurvivesAStreamOutage(t *testing.T) {
	e := newEnv(t)
	now := func(name string) (c config.Config) {
		c = e.config(name)
		c.CA.RotateMinInterval = 0 // rotate at once
		return c
	}
	a := e.start(t, now("signer-a"))
	b := e.start(t, now("signer-b"))
	rootOf(t, e, e.nc) // one cert.issued, so the stream is not empty

	// The stream refuses every new message (full, discard new): the first publish
	// attempts fail with a non-retryable JetStream error.
	ctx := context.Background()
	st, err := e.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	full := cfg
	full.MaxMsgs, full.Discard = int64(info.State.Msgs), jetstream.DiscardNew
	if _, err := e.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}

	mat, err := a.source.Rotate(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	gen := mat.Generation
	testkit.EventuallyWithin(t, 10*time.Second, "both replicas failed to announce", func() bool {
		return a.source.AnnounceFailures() >= 1 && b.source.AnnounceFailures() >= 1 && b.auth.Current().Generation == gen
	})
	if n := count(t, e.js, events.SubjectTrustChanged); n != 0 {
		t.Fatalf("%d trust.changed in a full stream", n)
	}

	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyWithin(t, 15*time.Second, "trust.changed once the stream takes it", func() bool {
		return count(t, e.js, events.SubjectTrustChanged) >= 1
	})
	testkit.EventuallyWithin(t, 15*time.Second, "both replicas announced", func() bool {
		return a.source.Announced() >= gen && b.source.Announced() >= gen
	})
	if n := count(t, e.js, events.SubjectTrustChanged); n != 1 {
		t.Fatalf("%d trust.changed events for one rotation, want 1", n)
	}
	tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged)
	if tc.Generation != gen || tc.Reason != events.TrustReasonRotation || len(tc.Roots) != 2 || len(tc.Added) != 1 || tc.Added[0] != mat.RootFingerprint() {
		t.Fatalf("trust.changed %+v", tc)
	}
	body := a.metrics(t)
	if !strings.Contains(body, "meshagent_signer_trust_changed_publish_failures_total") || strings.Contains(body, "meshagent_signer_trust_changed_publish_failures_total 0\n") {
		t.Error("metrics do not count the failed announcements")
	}
}

// TestAForgedTrustChangedDoesNotSilenceTheRealOne: a replica announces a change
// unless the stream's last trust.changed is that announcement; one that only
// claims the generation (published with a leaked credential) does not count.
func TestAForgedTrustChangedDoesNotSilenceTheRealOne(t *testing.T) {
	e := newEnv(t)
	c := e.config("signer-a")
	c.CA.RotateMinInterval = 0
	a := e.start(t, c)
	gen := a.auth.Current().Generation
	forged := events.TrustChanged{TrustDomain: c.TrustDomain, Roots: a.auth.Current().RootPEMs(), Generation: gen + 1, Reason: events.TrustReasonRotation}
	msg, err := events.NewMsg(events.SubjectTrustChanged, "forger", forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	mat, err := a.source.Rotate(context.Background(), false)
	if err != nil || mat.Generation != gen+1 {
		t.Fatalf("rotate: generation %v, %v", mat, err)
	}
	testkit.EventuallyWithin(t, 10*time.Second, "the genuine trust.changed", func() bool { return count(t, e.js, events.SubjectTrustChanged) == 2 })
	if tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged); tc.Generation != gen+1 || len(tc.Endorsements) == 0 {
		t.Fatalf("last trust.changed %+v", tc)
	}
}
