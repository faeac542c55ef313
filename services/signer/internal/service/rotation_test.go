package service

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/testkit"
	"github.com/nats-io/nats.go"
)

// rootOf signs a CSR over NATS and returns the fingerprint of the chain's root.
func rootOf(t *testing.T, e *env, nc *nats.Conn) string {
	t.Helper()
	_, csr := testkit.CSR(t, pki.ECP256, askedID)
	rep := natsSign(t, nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), TTLSeconds: 60})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	verifyChain(t, rep.CertChain, rep.Roots, e.clock())
	certs := mustCerts(t, rep.CertChain)
	return pki.Fingerprint(certs[len(certs)-1])
}

func TestRootRotationAcrossReplicas(t *testing.T) {
	e := newEnv(t)
	clock := testkit.NewClock(time.Now())
	e.clock = clock.Now
	cfg := func(name string) (c config.Config) {
		c = e.config(name)
		c.CA.RootTTL = 10 * time.Minute
		c.CA.CheckInterval = 20 * time.Millisecond
		return c
	}
	a := e.start(t, cfg("signer-a"))
	b := e.start(t, cfg("signer-b"))
	old := bundle(t, e.nc)
	if a.Authority().Current().RootFingerprint() != b.Authority().Current().RootFingerprint() {
		t.Fatal("replicas on different roots")
	}
	oldFP := a.Authority().Current().RootFingerprint()

	// 10% of the root's life left: the periodic check rotates, once, fleet-wide.
	clock.Add(9 * time.Minute)
	testkit.Eventually(t, 10*time.Second, "both replicas on the new root", func() bool {
		return a.Authority().Current().Generation == 2 && b.Authority().Current().Generation == 2
	})
	newFP := a.Authority().Current().RootFingerprint()
	if newFP == oldFP || b.Authority().Current().RootFingerprint() != newFP {
		t.Fatal("no new root")
	}
	testkit.Eventually(t, 5*time.Second, "trust.changed", func() bool { return count(t, e.js, events.SubjectTrustChanged) >= 1 })
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
	_, csr := testkit.CSR(t, pki.ECP256, askedID)
	resp, err := istioCreate(istioClient(t, b, nb.Roots, nil, clock.Now), e.token(t, "shop", "web"), "", csr, 60)
	if err != nil {
		t.Fatal(err)
	}
	if certs := mustCerts(t, resp.CertChain); pki.Fingerprint(certs[len(certs)-1]) != newFP {
		t.Fatal("gRPC chain does not end at the new root")
	}
	if n := count(t, e.js, events.SubjectTrustChanged); n != 1 {
		t.Fatalf("%d trust.changed events for one rotation", n)
	}

	// meshctl rotate root, with a new key.
	rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true, Reason: "test"})
	if rr.Error != nil || rr.Fingerprint == newFP || len(rr.Roots) != 3 {
		t.Fatalf("rotate reply %+v (%d roots)", rr.Error, len(rr.Roots))
	}
	testkit.Eventually(t, 10*time.Second, "both replicas on the forced root", func() bool {
		return a.Authority().Current().RootFingerprint() == rr.Fingerprint && b.Authority().Current().RootFingerprint() == rr.Fingerprint
	})
	if n := count(t, e.js, events.SubjectTrustChanged); n != 2 {
		t.Fatalf("%d trust.changed events, want 2", n)
	}
	// The first root expires and leaves the bundle.
	clock.Add(2 * time.Minute)
	testkit.Eventually(t, 10*time.Second, "expired root dropped", func() bool {
		return len(a.Authority().Current().Roots) == 2 && len(b.Authority().Current().Roots) == 2
	})
	testkit.Eventually(t, 5*time.Second, "trust.changed on expiry", func() bool { return count(t, e.js, events.SubjectTrustChanged) == 3 })
	if tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged); tc.Reason != events.TrustReasonExpired || len(tc.Removed) != 1 || tc.Removed[0] != oldFP {
		t.Fatalf("trust.changed on expiry %+v", tc)
	}
}

func TestPluggedInMode(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	root := testkit.NewCA(t, "root", nil, now, 48*time.Hour)
	inter := testkit.NewCA(t, "inter", root, now, 24*time.Hour)
	dir := t.TempDir()
	testkit.WriteCACerts(t, dir, inter, []*x509.Certificate{root.Cert}, root.Cert)
	c := e.config("signer-p")
	c.CA.Dir = dir
	c.CA.ReloadDelay = 20 * time.Millisecond
	s := e.start(t, c)

	_, csr := testkit.CSR(t, pki.ECP256, askedID)
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
	testkit.WriteCACerts(t, dir, &testkit.CA{Cert: inter.Cert, Key: other.Key}, []*x509.Certificate{root.Cert}, root.Cert)
	plugged := s.Source().(*ca.Plugged)
	testkit.Eventually(t, 10*time.Second, "reload refused", func() bool { return plugged.Rejected() >= 1 })
	if !s.Authority().Current().Cert.Equal(inter.Cert) {
		t.Fatal("invalid material installed")
	}
	if rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")}); rep.Error != nil {
		t.Fatalf("signing after an invalid reload: %v", rep.Error)
	}
	if n := count(t, e.js, events.SubjectTrustChanged); n != 0 {
		t.Fatalf("trust.changed after an invalid reload")
	}
	// A new root and intermediate, with both roots in the bundle.
	root2 := testkit.NewCA(t, "root2", nil, now, 96*time.Hour)
	inter2 := testkit.NewCA(t, "inter2", root2, now, 24*time.Hour)
	testkit.WriteCACerts(t, dir, inter2, []*x509.Certificate{root2.Cert}, root2.Cert, root.Cert)
	testkit.Eventually(t, 10*time.Second, "reload", func() bool { return s.Authority().Current().Cert.Equal(inter2.Cert) })
	testkit.Eventually(t, 5*time.Second, "trust.changed", func() bool { return count(t, e.js, events.SubjectTrustChanged) == 1 })
	if tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged); tc.Reason != events.TrustReasonReload || len(tc.Roots) != 2 {
		t.Fatalf("trust.changed %+v", tc)
	}
	if fp := rootOf(t, e, e.nc); fp != pki.Fingerprint(root2.Cert) {
		t.Fatal("not signing under the new root")
	}
}
