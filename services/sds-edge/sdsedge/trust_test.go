package sdsedge_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
)

const podID = "spiffe://cluster.local/ns/default/sa/web"

// fetch asks the pod's SDS server for names once, over its unix socket.
func (p *pod) fetch(t testing.TB, names ...string) map[string]sdsclient.Secret {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := sdsclient.Fetch(ctx, p.dial(t), "sidecar~10.0.0.1~"+testPod+".default~default.svc.cluster.local", names...)
	if err != nil {
		t.Fatalf("fetch %v: %v", names, err)
	}
	return got
}

// rejected is meshagent_sds_edge_trust_rejected_total of source.
func (p *pod) rejected(t testing.TB, source string) float64 {
	t.Helper()
	return obstest.Metric(t, p.reg, "meshagent_sds_edge_trust_rejected_total", map[string]string{"source": source})
}

// bootstrapMode is the mode label of meshagent_sds_edge_trust_bootstrap set to 1.
func (p *pod) bootstrapMode() string {
	mfs, _ := p.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "meshagent_sds_edge_trust_bootstrap" {
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() == 1 {
					return m.GetLabel()[0].GetValue()
				}
			}
		}
	}
	return ""
}

func (v *env) publishTrust(t testing.TB, ev events.TrustChanged) {
	t.Helper()
	msg, err := events.NewMsg(events.SubjectTrustChanged, "test-ca", ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	if err := v.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func fingerprints(t testing.TB, pemBytes []byte) []string {
	t.Helper()
	certs, err := pki.ParseCertsPEM(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(certs))
	for i, c := range certs {
		out[i] = pki.Fingerprint(c)
	}
	return out
}

func TestForgedTrustChangedChangesNothing(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "ROOTCA")
	before := recv(t, st).Secrets["ROOTCA"].TrustedCA
	if p.bootstrapMode() != "first-use" {
		t.Fatalf("bootstrap mode %q, want first-use", p.bootstrapMode())
	}
	evil := newTestCA(t)
	forged := append(evil.bundle(), v.ca.bundle()...)
	for i, ev := range []events.TrustChanged{
		{TrustDomain: "cluster.local", Roots: forged, Reason: events.TrustReasonRotation, Generation: 50},
		{TrustDomain: "cluster.local", Roots: forged, Reason: events.TrustReasonRotation, Generation: 51,
			Endorsements: endorseWith(t, "cluster.local", 51, forged, evil.keys[0])},
		// A genuine endorsement of other bytes, pasted on the forged bundle.
		{TrustDomain: "cluster.local", Roots: forged, Reason: events.TrustReasonRotation, Generation: 52,
			Endorsements: v.ca.endorse(t, 52, v.ca.bundle())},
		// Removing the genuine root without the CA's word.
		{TrustDomain: "cluster.local", Roots: evil.bundle(), Removed: []string{pki.Fingerprint(v.ca.roots[0])},
			Reason: events.TrustReasonRotation, Generation: 53},
	} {
		v.publishTrust(t, ev)
		testkit.Eventually(t, "forged trust.changed rejected", func() bool { return p.rejected(t, "trust.changed") == float64(i+1) })
	}
	if got := p.fetch(t, "ROOTCA")["ROOTCA"].TrustedCA; !bytes.Equal(got, before) {
		t.Fatal("ROOTCA changed after forged trust.changed")
	}
	// A genuine rotation afterwards still applies, and is the next push.
	v.ca.rotate(t)
	v.publishTrust(t, v.ca.trustChanged(t, 2, v.ca.bundle()))
	got := fingerprints(t, recv(t, st).Secrets["ROOTCA"].TrustedCA)
	want := fingerprints(t, []byte(strings.Join(v.ca.bundle(), "")))
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("ROOTCA after the genuine rotation has %d roots, want the CA's %d", len(got), len(want))
	}
}

func TestEndorsedRotationsApplyAndReplaysDoNot(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "ROOTCA", "default")
	for u := recv(t, st); len(u.Secrets) < 2; {
		for n, s := range recv(t, st).Secrets {
			u.Secrets[n] = s
		}
	}
	r0 := v.ca.roots[0]
	// Same key, new certificate: endorsed by that key.
	r1 := v.ca.rotateSameKey(t)
	v.publishTrust(t, v.ca.trustChanged(t, 2, v.ca.bundle()))
	if got := fingerprints(t, recv(t, st).Secrets["ROOTCA"].TrustedCA); len(got) != 2 || got[0] != pki.Fingerprint(r1) {
		t.Fatalf("same-key rotation: ROOTCA %d roots", len(got))
	}
	// New key, endorsed by the old key only (the one the pod trusts).
	oldKey := v.ca.keys[0]
	r2 := v.ca.rotate(t)
	roots := v.ca.bundle()
	v.publishTrust(t, events.TrustChanged{TrustDomain: "cluster.local", Roots: roots, Reason: events.TrustReasonRotation, Generation: 3,
		Endorsements: endorseWith(t, "cluster.local", 3, roots, oldKey)})
	if got := fingerprints(t, recv(t, st).Secrets["ROOTCA"].TrustedCA); len(got) != 3 || got[0] != pki.Fingerprint(r2) {
		t.Fatalf("new-key rotation: ROOTCA %d roots", len(got))
	}
	// The new root now validates leaves: a renewal under it is served.
	renew(t, v.nc, "")
	var leafChain []byte
	for leafChain == nil {
		leafChain = recv(t, st).Secrets["default"].CertChain
	}
	if chain, _ := pki.ParseCertsPEM(leafChain); chain[0].CheckSignatureFrom(r2) != nil {
		t.Fatal("renewed leaf is not under the new root")
	}
	// A replay of an older, genuinely endorsed generation (one that would drop the
	// newest root) is ignored: the next push is the one after it.
	v.publishTrust(t, v.ca.trustChanged(t, 2, pki.CertPEMs([]*x509.Certificate{r1, r0}), pki.Fingerprint(r2)))
	subj, _ := events.PodAnchorsSubject(testPodRef)
	anchor := newTestCA(t).roots[0]
	msg, _ := events.NewMsg(subj, "xds-relay", events.TrustAnchors{Pod: testPodRef, Roots: pki.CertPEMs([]*x509.Certificate{anchor})})
	if err := v.nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	got := fingerprints(t, recv(t, st).Secrets["ROOTCA"].TrustedCA)
	if len(got) != 4 || got[0] != pki.Fingerprint(r2) || got[3] != pki.Fingerprint(anchor) {
		t.Fatalf("after a replay and new anchors: %d roots, want r2, r1, r0 and the anchor", len(got))
	}
	if p.rejected(t, "trust.changed") != 0 {
		t.Fatalf("a genuine event was rejected")
	}
}

// rogue answers every sign request before the signer can: a leaf for the pod's
// own identity under evil's root, with a bundle endorsed by evil (odd attempts), or
// with the genuine CA's current endorsed bundle pasted in (even attempts).
// stop unsubscribes it.
func rogue(t testing.TB, nc *nats.Conn, evil, genuine *testCA) (answered *atomic.Int32, stop func()) {
	var n atomic.Int32
	sub, err := nc.Subscribe(events.SignWildcard, func(m *nats.Msg) {
		req, enc, err := events.DecodeSignRequest(m)
		if err != nil {
			return
		}
		chain, err := evil.sign([]byte(req.CSR), podID, time.Hour)
		if err != nil {
			return
		}
		reply := events.SignReply{CertChain: chain, TrustDomain: "cluster.local"}
		if n.Add(1)%2 == 1 {
			roots := append(evil.bundle(), genuine.bundle()...)
			reply.Roots, reply.Generation = roots, 99
			reply.Endorsements = endorseWith(t, "cluster.local", 99, roots, evil.keys[0])
		} else {
			reply.Roots, reply.Generation, reply.Endorsements = genuine.current(t)
		}
		out, _ := events.NewSignReplyMsg(m.Reply, enc, "rogue", reply)
		_ = m.RespondMsg(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	stop = func() { _ = sub.Unsubscribe(); _ = nc.Flush() }
	t.Cleanup(stop)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n, stop
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// With the mesh root at Istio's path, the pod trusts it from the start: a rogue
// answering the very first request is refused, nothing is served or written.
func TestRogueSignerRefusedWithAnchors(t *testing.T) {
	v := newEnv(t)
	root := testkit.ShortDir(t)
	writeFile(t, filepath.Join(root, "var/run/secrets/istio/root-cert.pem"), []byte(v.ca.bundle()[0]))
	evil := newTestCA(t)
	v.ca.silent.Store(true)
	answered, stop := rogue(t, v.nc, evil, v.ca)
	p := v.startPod(podOpt{root: root, args: []string{"-output-certs", "out"}})
	testkit.Eventually(t, "rogue replies refused", func() bool { return answered.Load() >= 3 && p.rejected(t, "sign-reply") >= 3 })
	if p.e.Ready() == nil {
		t.Fatal("ready with a rogue's certificate")
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "out")); len(ents) != 0 {
		t.Fatalf("%d files in OUTPUT_CERTS from a rogue reply", len(ents))
	}
	stop()
	v.ca.silent.Store(false)
	testkit.Eventually(t, "ready with the signer's certificate", func() bool { return p.e.Ready() == nil })
	checkGenuine(t, p, v.ca, evil, filepath.Join(root, "out"))
	if p.bootstrapMode() != "anchors" {
		t.Fatalf("bootstrap mode %q, want anchors", p.bootstrapMode())
	}
}

// Without anchors the first reply is trusted on first use; a rogue answering a
// renewal after that is refused: the pod keeps serving its certificate and files.
func TestRogueSignerRefusedAfterFirstUse(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{args: []string{"-output-certs", "out"}})
	out := filepath.Join(p.cfg.Pod.RootDir, "out")
	st := p.open(t, p.dial(t), "default")
	first := recv(t, st).Secrets["default"]
	testkit.Eventually(t, "files written", func() bool {
		b, _ := os.ReadFile(filepath.Join(out, "key.pem"))
		return bytes.Equal(b, first.PrivateKey)
	})
	evil := newTestCA(t)
	v.ca.silent.Store(true)
	answered, stop := rogue(t, v.nc, evil, v.ca)
	renew(t, v.nc, "")
	testkit.Eventually(t, "rogue replies refused", func() bool { return answered.Load() >= 3 && p.rejected(t, "sign-reply") >= 3 })
	if got := p.fetch(t, "default")["default"]; !bytes.Equal(got.CertChain, first.CertChain) {
		t.Fatal("default changed after rogue replies")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "key.pem")); !bytes.Equal(b, first.PrivateKey) {
		t.Fatal("OUTPUT_CERTS rewritten after rogue replies")
	}
	stop()
	v.ca.silent.Store(false)
	next := recv(t, st).Secrets["default"] // the retry reaches the signer
	if bytes.Equal(next.CertChain, first.CertChain) {
		t.Fatal("no renewal after the rogue left")
	}
	checkGenuine(t, p, v.ca, evil, out)
}

// checkGenuine checks that the pod serves and writes the genuine CA's certificate
// and roots, and nothing of evil's.
func checkGenuine(t testing.TB, p *pod, genuine, evil *testCA, out string) {
	t.Helper()
	got := p.fetch(t, "default", "ROOTCA")
	pool := x509.NewCertPool()
	for _, r := range genuine.roots {
		pool.AddCert(r)
	}
	leaf := leafOf(t, got["default"])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("served leaf is not the signer's: %v", err)
	}
	evilFP := pki.Fingerprint(evil.roots[0])
	for _, fp := range fingerprints(t, got["ROOTCA"].TrustedCA) {
		if fp == evilFP {
			t.Fatal("the rogue's root is in ROOTCA")
		}
	}
	testkit.Eventually(t, "files written", func() bool {
		b, _ := os.ReadFile(filepath.Join(out, "key.pem"))
		return bytes.Equal(b, got["default"].PrivateKey)
	})
	roots, _ := os.ReadFile(filepath.Join(out, "root-cert.pem"))
	for _, fp := range fingerprints(t, roots) {
		if fp == evilFP {
			t.Fatal("the rogue's root is in root-cert.pem")
		}
	}
}

// Anchors that do not vouch for the signer's bundle: the pod trusts nothing, serves
// nothing, and counts every refusal.
func TestWrongTrustAnchorsRefuseTheBundle(t *testing.T) {
	v := newEnv(t)
	root := testkit.ShortDir(t)
	other := newTestCA(t)
	writeFile(t, filepath.Join(root, "anchors.pem"), []byte(other.bundle()[0]))
	p := v.startPod(podOpt{root: root, args: []string{"-trust-anchors-file", "anchors.pem"}})
	testkit.Eventually(t, "replies refused", func() bool { return p.rejected(t, "sign-reply") >= 2 })
	if p.e.Ready() == nil || p.bootstrapMode() != "" {
		t.Fatalf("ready %v, bootstrap mode %q: want neither", p.e.Ready(), p.bootstrapMode())
	}
}

// On the Istio gRPC path the root comes from the chain itself: with anchors, a
// CA whose chain does not end at one of them is refused even over verified TLS.
func TestIstioGRPCCAChainMustReachTrustedRoot(t *testing.T) {
	v := newEnv(t)
	addr := v.ca.serveGRPC(t)
	root := testkit.ShortDir(t)
	writeFile(t, filepath.Join(root, "ca-root.pem"), []byte(v.ca.bundle()[0]))
	writeFile(t, filepath.Join(root, "anchors.pem"), []byte(newTestCA(t).bundle()[0]))
	p := v.startPod(podOpt{root: root, args: []string{"-ca-addr", addr, "-ca-root-cert", "ca-root.pem", "-trust-anchors-file", "anchors.pem"}})
	testkit.Eventually(t, "chains refused", func() bool { return v.ca.requests.Load() >= 2 && p.rejected(t, "sign-reply") >= 2 })
	if p.e.Ready() == nil {
		t.Fatal("ready with a chain to an untrusted root")
	}
	// The same CA with its root as the anchor is accepted.
	root2 := testkit.ShortDir(t)
	writeFile(t, filepath.Join(root2, "ca-root.pem"), []byte(v.ca.bundle()[0]))
	writeFile(t, filepath.Join(root2, "anchors.pem"), []byte(v.ca.bundle()[0]))
	p2 := v.startPod(podOpt{root: root2, args: []string{"-ca-addr", addr, "-ca-root-cert", "ca-root.pem", "-trust-anchors-file", "anchors.pem",
		"-socket", filepath.Join(root2, "s2.sock")}})
	testkit.Eventually(t, "ready", func() bool { return p2.e.Ready() == nil })
	if p2.bootstrapMode() != "anchors" {
		t.Fatalf("bootstrap mode %q", p2.bootstrapMode())
	}
}
