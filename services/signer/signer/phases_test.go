package signer

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// lastPEMAgent behaves as Istio's pilot-agent with our CA: it renews over the
// IstioCertificateService gRPC API, presents the reply without its last PEM, and
// trusts that last PEM alone (not the bus's bundle).
type lastPEMAgent struct {
	name  string
	cert  tls.Certificate
	trust *x509.Certificate
}

func renewAgent(t *testing.T, e *env, s *replica, fake *clock.Fake, name string) lastPEMAgent {
	t.Helper()
	key, csr := signertest.CSR(t, pki.ECP256, "spiffe://cluster.local/ns/shop/sa/"+name)
	resp, err := istioCreate(istioClient(t, s, bundle(t, e.nc).Roots, nil, fake.Now), e.token(t, "shop", name), "", csr, 3600)
	if err != nil {
		t.Fatalf("%s: CreateCertificate: %v", name, err)
	}
	if len(resp.CertChain) < 2 {
		t.Fatalf("%s: a reply of %d PEMs (an Istio agent refuses fewer than 2)", name, len(resp.CertChain))
	}
	certs, err := pki.ParseCertPEMs(resp.CertChain)
	if err != nil {
		t.Fatal(err)
	}
	a := lastPEMAgent{name: name, trust: certs[len(certs)-1], cert: tls.Certificate{PrivateKey: crypto.Signer(key), Leaf: certs[0]}}
	for _, c := range certs[:len(certs)-1] {
		a.cert.Certificate = append(a.cert.Certificate, c.Raw)
	}
	return a
}

// verifyPeer checks a peer's chain as Envoy does for an Istio peer: against the one
// trusted root, at now, with a SPIFFE ID.
func (a lastPEMAgent) verifyPeer(now func() time.Time) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no peer certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return err
			}
			certs[i] = c
		}
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(a.trust)
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return err
		}
		if len(certs[0].URIs) != 1 || certs[0].URIs[0].Scheme != "spiffe" {
			return errors.New("peer has no SPIFFE ID")
		}
		return nil
	}
}

func (a lastPEMAgent) tlsConfig(now func() time.Time) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{a.cert}, MinVersion: tls.VersionTLS13, Time: now,
		// The SPIFFE ID is the name: verified by hand, as Envoy's validator does.
		InsecureSkipVerify: true, ClientAuth: tls.RequireAnyClientCert, //nolint:gosec // verifyPeer verifies
		VerifyPeerCertificate: a.verifyPeer(now),
	}
}

// lastPEMHandshake runs a real TLS 1.3 handshake over a unix socket, server serving and client
// dialing, each verifying the other against what it trusts.
func lastPEMHandshake(t *testing.T, server, client lastPEMAgent, now func() time.Time) error {
	t.Helper()
	ln, err := tls.Listen("unix", filepath.Join(testkit.ShortDir(t), "s"), server.tlsConfig(now))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		served <- c.(*tls.Conn).Handshake()
	}()
	c, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, client.tlsConfig(now))
	cerr := tc.Handshake()
	if cerr == nil { // TLS 1.3: the server's verdict on the client arrives with the first read
		_, _ = tc.Write([]byte{0})
	}
	_ = tc.Close()
	serr := <-served
	return errors.Join(cerr, serr)
}

func bothWays(t *testing.T, a, b lastPEMAgent, now func() time.Time) error {
	t.Helper()
	return errors.Join(lastPEMHandshake(t, a, b, now), lastPEMHandshake(t, b, a, now))
}

// A rotation to a new key through the real signer and its real gRPC API: at each
// phase a pod that renewed just before the phase began and one that renews just
// after it, each trusting only the last PEM of its own reply, complete mTLS both
// ways; while the bus's bundle (ROOTCA for sds-edge's pods) holds both roots until
// the old one leaves, three steps after the rotation. A pod that trusted the new
// root alone at once would be cut off: the split this avoids.
func TestRotationPhasesOverGRPCKeepPodsTalking(t *testing.T) {
	e := newEnv(t)
	fake := clock.NewFake(time.Now())
	e.clock = fake
	c := e.config("signer-a")
	c.Certs.DefaultTTL, c.Certs.MaxTTL = time.Hour, time.Hour
	c.CA.RootTTL = 1000 * time.Hour
	c.CA.CheckInterval = 20 * time.Millisecond
	s := e.start(t, c)
	step := time.Hour + ca.RetireSlack

	before := renewAgent(t, e, s, fake, "before")
	oldRoot := before.trust
	gen := bundle(t, e.nc).Generation
	dry := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true, DryRun: true})
	now := fake.Now().Truncate(time.Second) // certificates keep whole seconds
	if p := dry.Plan; dry.Error != nil || p == nil || p.Phase != 1 || !p.Rotated.Equal(now) || !p.NewRootLast.Equal(now.Add(step)) || !p.Settled.Equal(now.Add(2*step)) || !p.OldRootLeaves.Equal(now.Add(3*step)) {
		t.Fatalf("dry run: %+v (error %v)", dry.Plan, dry.Error)
	}
	if bundle(t, e.nc).Generation != gen || dry.Fingerprint != pki.Fingerprint(oldRoot) {
		t.Fatal("a dry run changed the root")
	}
	rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true})
	if rr.Error != nil {
		t.Fatal(rr.Error)
	}
	rotAt := fake.Now()
	if rr.Plan == nil || !rr.Plan.OldRootLeaves.Equal(dry.Plan.OldRootLeaves) || rr.Plan.Phase != 1 {
		t.Fatalf("the rotation's plan %+v, the dry run's %+v", rr.Plan, dry.Plan)
	}
	if again := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true, DryRun: true}); again.Error == nil || again.Error.Code != events.CodeResourceExhausted {
		t.Fatalf("a dry run of a new key during the phases: %+v", again)
	}
	p1 := renewAgent(t, e, s, fake, "phase1")
	if !p1.trust.Equal(oldRoot) {
		t.Fatal("phase 1: the reply's last PEM is not the old root")
	}
	if err := bothWays(t, before, p1, fake.Now); err != nil {
		t.Fatalf("phase 1, a pod from before the rotation and one after: %v", err)
	}
	b := bundle(t, e.nc)
	if len(b.Roots) != 2 {
		t.Fatalf("bundle of %d roots during the rotation, want old and new", len(b.Roots))
	}
	newRoots, _ := pki.ParseCertPEMs(b.Roots[:1])
	// The record names the root the leaf is under, with a chain that ends there (the
	// rotator and the inventory check it so): no cross-signed certificate in it.
	ci := last[events.CertIssued](t, e.js, events.SubjectCertIssued)
	recChain := mustCerts(t, ci.CertChain)
	if ci.RootFingerprint != pki.Fingerprint(newRoots[0]) || recChain[len(recChain)-1].CheckSignatureFrom(newRoots[0]) != nil {
		t.Fatalf("cert.issued in phase 1: root %.16s, a chain of %d not ending under the new root", ci.RootFingerprint, len(recChain))
	}
	naive := p1
	naive.trust = newRoots[0]
	if bothWays(t, before, naive, fake.Now) == nil {
		t.Fatal("a pod trusting only the new root talked to one from before the rotation: the test cannot see a split")
	}

	for i, want := range []struct {
		name string
		at   time.Duration
		root *x509.Certificate
	}{{"phase 2", step, newRoots[0]}, {"phase 3", 2 * step, newRoots[0]}} {
		fake.Set(rotAt.Add(want.at - time.Minute))
		late := renewAgent(t, e, s, fake, fmt.Sprintf("late%d", i+1))
		fake.Set(rotAt.Add(want.at + time.Minute))
		var next lastPEMAgent
		testkit.EventuallyWithin(t, 10*time.Second, want.name+" begins", func() bool {
			next = renewAgent(t, e, s, fake, fmt.Sprintf("phase%d", i+2))
			return next.trust.Equal(want.root) && (i == 0) == (len(next.cert.Certificate) == 2)
		})
		if err := bothWays(t, late, next, fake.Now); err != nil {
			t.Fatalf("%s, a pod renewed a minute before it began and one after: %v", want.name, err)
		}
		if len(bundle(t, e.nc).Roots) != 2 {
			t.Fatalf("%s: the old root left the bundle too early", want.name)
		}
	}
	fake.Set(rotAt.Add(3*step - time.Minute))
	prev := renewAgent(t, e, s, fake, "late3")
	fake.Set(rotAt.Add(3*step + time.Minute))
	testkit.EventuallyWithin(t, 10*time.Second, "the old root leaves the bundle", func() bool { return len(bundle(t, e.nc).Roots) == 1 })
	// The bundle shrinks before the announcement is stored: wait for it to land.
	var tc events.TrustChanged
	testkit.EventuallyWithin(t, 10*time.Second, "the root-retired announcement", func() bool {
		tc = last[events.TrustChanged](t, e.js, events.SubjectTrustChanged)
		return tc.Reason == events.TrustReasonRetired
	})
	if tc.Reason != events.TrustReasonRetired || len(tc.Removed) != 1 || tc.Removed[0] != pki.Fingerprint(oldRoot) {
		t.Fatalf("trust.changed %+v, want root-retired removing the old root", tc)
	}
	after := renewAgent(t, e, s, fake, "after")
	if err := bothWays(t, prev, after, fake.Now); err != nil {
		t.Fatalf("after the old root left: %v", err)
	}
}

// TestBundleCarriesTheLiveRotationPlan: a bundle request that asks for it
// (meshctl status and rotate root, under any role's credential) gets the plan of
// the rotation under way as the signer holds it now: none before a rotation,
// phase 1 right after it, phase 2 once its time came; a pod's plain bundle
// request carries none. Before, the plan was only in the rotation's own reply and
// in a dry run, which is refused for a minute after a rotation.
func TestBundleCarriesTheLiveRotationPlan(t *testing.T) {
	e := newEnv(t)
	fake := clock.NewFake(time.Now())
	e.clock = fake
	c := e.config("signer-a")
	c.Certs.DefaultTTL, c.Certs.MaxTTL = time.Hour, time.Hour
	c.CA.RootTTL = 1000 * time.Hour
	c.CA.CheckInterval = 20 * time.Millisecond
	e.start(t, c)
	live := func() *events.RotationPlan {
		t.Helper()
		rep := natsCall[events.BundleRequest, events.BundleReply](t, e.nc, events.SubjectTrustBundle, events.BundleRequest{Rotation: true})
		if rep.Error != nil {
			t.Fatal(rep.Error)
		}
		return rep.Rotation
	}
	if p := live(); p == nil || !p.Rotated.IsZero() {
		t.Fatalf("before any rotation: %+v, want a plan with nothing rotated", p)
	}
	rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true})
	if rr.Error != nil || rr.Plan == nil {
		t.Fatalf("rotate: %+v", rr)
	}
	if p := live(); p == nil || p.Phase != 1 || !p.Rotated.Equal(rr.Plan.Rotated) || !p.NewRootLast.Equal(rr.Plan.NewRootLast) {
		t.Fatalf("right after the rotation: %+v, the rotation's %+v", p, rr.Plan)
	}
	if bundle(t, e.nc).Rotation != nil {
		t.Fatal("a pod's plain bundle request carries the plan")
	}
	fake.Set(rr.Plan.NewRootLast.Add(time.Minute))
	testkit.EventuallyWithin(t, 10*time.Second, "phase 2 in the live plan", func() bool {
		p := live()
		return p != nil && p.Phase == 2
	})
}
