package sdsedge_test

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// bundleHeaderOf is a trust bundle header (events.TrustBundleHeader) of roots at
// gen, endorsed by each of by over endorsed (roots when nil: an endorsement of
// other roots is a wrong one).
func bundleHeaderOf(t *testing.T, roots []*x509.Certificate, gen uint64, endorsed []*x509.Certificate, by ...crypto.Signer) string {
	t.Helper()
	if endorsed == nil {
		endorsed = roots
	}
	es, err := trustbundle.Endorse("cluster.local", gen, pki.CertPEMs(endorsed), by...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(events.BundleReply{TrustDomain: "cluster.local", Roots: pki.CertPEMs(roots), Generation: gen, Endorsements: es})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// renewed asks p for a renewal on its bus and waits until it serves a new
// certificate, which it returns with the roots served beside it.
func (p *pod) renewed(t *testing.T, what string) served {
	t.Helper()
	var before, cur served
	testkit.Eventually(t, what+": the pod serves a certificate", func() bool {
		s, err := p.served(t)
		before = s
		return err == nil
	})
	renewPodNamed(t, p.nc, testPod, pki.SerialHex(before.chain[0]))
	testkit.Eventually(t, what+": the pod serves a renewed certificate", func() bool {
		s, err := p.served(t)
		cur = s
		return err == nil && !s.chain[0].Equal(before.chain[0])
	})
	return cur
}

// A gRPC CA's reply header may change what a pod trusts only with the mesh CA's
// endorsement (issue 37 item 2): a responder without that key — a header endorsed
// by a key the pod does not trust, not endorsed, or endorsed over other roots —
// cannot remove a root or plant one; each is counted as a rejected bundle, and
// the reply is taken as Istio's, without the header. No header (istiod) leaves
// the roots as they were. The positive control: the same bundle endorsed by the
// CA's key replaces the roots, the old root leaving.
func TestGRPCTrustHeaderChangesRootsOnlyWhenEndorsed(t *testing.T) {
	ca := newTestCA(t)
	old := ca.roots[0]
	newRoot := &testkit.CA{Cert: ca.rotate(t)} // bundle [new, old], generation 2
	ca.mu.Lock()
	newRoot.Key = ca.keys[0]
	ca.mu.Unlock()
	addr := ca.serveGRPC(t)
	dir := testkit.ShortDir(t)
	file := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(file, testkit.CertsPEM([]*x509.Certificate{newRoot.Cert, old}), 0o644); err != nil {
		t.Fatal(err)
	}
	// The pod's bus has no signer on it: no bundle reaches it but the gRPC reply's.
	ns := bustest.Server(t)
	v := &env{t: t, ns: ns, nc: bustest.Conn(t, ns), ca: ca}
	p := v.startPod(podOpt{root: dir, args: []string{"-ca-addr", addr, "-ca-root-cert", file}})
	both := []*x509.Certificate{newRoot.Cert, old}
	evil := testkit.NewCA(t, "meshagent root CA", nil, time.Now().Add(-time.Hour), 24*time.Hour)
	retired := []*x509.Certificate{newRoot.Cert}

	rejected := 0.0
	for _, tc := range []struct {
		name   string
		header string // "": none
	}{
		{"no header (istiod)", ""},
		{"endorsed by a key the pod does not trust", bundleHeaderOf(t, retired, 3, nil, evil.Key)},
		{"not endorsed", bundleHeaderOf(t, retired, 3, nil)},
		{"endorsed by the CA's key over other roots", bundleHeaderOf(t, retired, 3, both, newRoot.Key)},
		{"planting a root, endorsed by its own key", bundleHeaderOf(t, []*x509.Certificate{evil.Cert, newRoot.Cert}, 3, nil, evil.Key)},
	} {
		if tc.header == "" {
			ca.bundleHeader.Store(nil)
		} else {
			ca.bundleHeader.Store(&tc.header)
		}
		s := p.renewed(t, tc.name)
		if !hasAll(s.roots, both...) || len(s.roots) != 2 {
			t.Fatalf("%s: the pod serves %d roots (old %t, new %t, evil %t), want both of its own", tc.name, len(s.roots),
				hasAll(s.roots, old), hasAll(s.roots, newRoot.Cert), hasAll(s.roots, evil.Cert))
		}
		if tc.header != "" {
			rejected++
		}
		if got := p.metric(t, "meshagent_sds_edge_trust_rejected_total"); got != rejected {
			t.Fatalf("%s: %v trust bundles rejected, want %v", tc.name, got, rejected)
		}
	}

	good := bundleHeaderOf(t, retired, 3, nil, newRoot.Key)
	ca.bundleHeader.Store(&good)
	p.renewed(t, "endorsed by the CA's key")
	testkit.Eventually(t, "the pod drops the root its CA's endorsed bundle leaves out", func() bool {
		s, err := p.served(t)
		return err == nil && len(s.roots) == 1 && s.roots[0].Equal(newRoot.Cert)
	})
	if got := p.metric(t, "meshagent_sds_edge_trust_rejected_total"); got != rejected {
		t.Fatalf("the endorsed bundle: %v trust bundles rejected, want %v", got, rejected)
	}

	// Restarted with the same -ca-root-cert (both roots, as mounted), the pod serves
	// the certificate it kept, without asking the CA, and beside it the roots it
	// trusted last: not the retired root its mount still names (it served every
	// anchor before its first bundle).
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	asked := ca.requests.Load()
	p = v.startPod(podOpt{root: dir, noTok: true, args: []string{"-ca-addr", addr, "-ca-root-cert", file}})
	var s served
	testkit.Eventually(t, "the restarted pod serves its kept certificate", func() bool {
		var err error
		s, err = p.served(t)
		return err == nil
	})
	if n := ca.requests.Load() - asked; n != 0 {
		t.Fatalf("the restarted pod asked the CA %d times: its kept certificate was not served", n)
	}
	if len(s.roots) != 1 || !s.roots[0].Equal(newRoot.Cert) {
		t.Fatalf("after a restart the pod serves %d roots (old %t), want the new root alone", len(s.roots), hasAll(s.roots, old))
	}
}
