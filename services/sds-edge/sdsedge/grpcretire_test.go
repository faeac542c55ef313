package sdsedge_test

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/devtokentest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// busRoots is the signer's trust bundle on its bus.
func busRoots(t *testing.T, nc *nats.Conn) ([]*x509.Certificate, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := trustbundle.Fetch(ctx, nc, "test")
	if err != nil {
		return nil, err
	}
	return pki.ParseCertPEMs(r.Roots)
}

// rotateNewKey asks the signer on nc to rotate to a new key and returns its plan.
func rotateNewKey(t *testing.T, nc *nats.Conn) events.RotationPlan {
	t.Helper()
	msg, err := events.NewMsgOn(events.SubjectRootRotate, "test", events.RotateRequest{NewKey: true, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rr, _, err := events.Decode[events.RotateReply](rep)
	if err != nil || rr.Error != nil || rr.Plan == nil {
		t.Fatalf("rotate: %+v %v", rr, err)
	}
	return *rr.Plan
}

// retireTTL is the certificates' lifetime in TestGRPCPodDropsRetiredRoot: each
// phase of a new-key rotation outlasts the longest leaf signed before it (TTL + 10 s
// backdating) by a minute, so the old root leaves about 3 × 75 s after the rotation.
const retireTTL = 5 * time.Second

// The real signer and a real sds-edge over Istio's gRPC API (CA_ADDR) alone — the
// pod's bus carries no signer, so no trust.changed — through a rotation to a new key
// until the old root is retired (issue 37 item 2). The pod, mounted with the old
// root as -ca-root-cert, learns the new root and, once the signer's bundle holds
// the new root alone, drops the old one from its ROOTCA, as a bus pod does; and it
// still does after a restart, with the same stale -ca-root-cert. Before, its ROOTCA
// kept the retired root until the root expired: Istio's reply carries no bundle,
// and the certified-root path only adds.
func TestGRPCPodDropsRetiredRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("a new-key rotation to the old root's retirement takes about 4 minutes")
	}
	caBus := bustest.Server(t)
	grpcAddr := testkit.FreeAddr(t)
	ttl := retireTTL.String()
	iss, signer := devtokentest.StartSigner(t, caBus.ClientURL(), "-instance", "retire", "-grpc-addr", grpcAddr,
		"-default-ttl", ttl, "-max-ttl", ttl, "-root-check-interval", "1s", "-max-early-certs-per-minute", "0")
	adm := bustest.Conn(t, caBus)
	var old []*x509.Certificate
	testkit.EventuallyWithin(t, 30*time.Second, "the signer serves its bundle", func() bool {
		r, err := busRoots(t, adm)
		old = r
		return err == nil && len(r) == 1
	})
	tok, err := iss.MintForPod("default", "web", testPod, "", 2*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	root := testkit.ShortDir(t)
	writeToken(t, root, tok)
	mounted := filepath.Join(root, "old-root.pem") // a ConfigMap nobody updates
	if err := os.WriteFile(mounted, testkit.CertsPEM(old), 0o644); err != nil {
		t.Fatal(err)
	}
	podBus := bustest.Server(t)
	v := &env{t: t, ns: podBus, nc: bustest.Conn(t, podBus)}
	opt := podOpt{root: root, noTok: true, args: []string{"-ca-addr", grpcAddr, "-ca-root-cert", mounted, "-secret-ttl", ttl}}
	p := v.startPod(opt)
	testkit.Eventually(t, "the pod serves a certificate under the old root", func() bool {
		s, err := p.served(t)
		return err == nil && len(s.roots) == 1 && s.roots[0].Equal(old[0])
	})

	plan := rotateNewKey(t, adm)
	t.Logf("rotated: phase 2 at +%s, phase 3 at +%s, the old root leaves at +%s", plan.NewRootLast.Sub(plan.Rotated).Round(time.Second),
		plan.Settled.Sub(plan.Rotated).Round(time.Second), plan.OldRootLeaves.Sub(plan.Rotated).Round(time.Second))
	var newRoot *x509.Certificate
	// With the bundle in the reply's header, at its first renewal in phase 1; before,
	// from the cross-signed certificate of phase 2's chain.
	testkit.EventuallyWithin(t, time.Until(plan.NewRootLast)+time.Minute, "the pod trusts the new root beside the old one", func() bool {
		s, err := p.served(t)
		if err != nil || len(s.roots) != 2 || !hasAll(s.roots, old[0]) {
			return false
		}
		newRoot = s.roots[0]
		return true
	})
	limit := time.Until(plan.OldRootLeaves) + time.Minute
	testkit.EventuallyWithin(t, limit, "the signer retires the old root", func() bool {
		r, err := busRoots(t, adm)
		return err == nil && len(r) == 1 && r[0].Equal(newRoot)
	})
	onlyNew := func(what string, p *pod) {
		t.Helper()
		var s served
		testkit.EventuallyWithin(t, 30*time.Second, what, func() bool {
			var err error
			s, err = p.served(t)
			return err == nil && len(s.roots) == 1 && s.roots[0].Equal(newRoot)
		})
		if time.Now().After(s.chain[0].NotAfter) {
			t.Fatalf("%s: the pod serves an expired certificate", what)
		}
	}
	onlyNew("the pod's ROOTCA drops the retired root", p)

	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	p = v.startPod(opt)
	onlyNew("after a restart, with the old root still mounted, the pod's ROOTCA holds the new root alone", p)
	first, err := p.served(t)
	if err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyWithin(t, 30*time.Second, "the restarted pod renews over gRPC", func() bool {
		s, err := p.served(t)
		return err == nil && !s.chain[0].Equal(first.chain[0])
	})
	onlyNew("after its first renewal since the restart", p)
	if n := p.metric(t, "meshagent_sds_edge_trust_rejected_total"); n != 0 {
		t.Errorf("the pod rejected %v trust bundles\nsigner log:\n%s", n, signer.Logs.String())
	}
}
