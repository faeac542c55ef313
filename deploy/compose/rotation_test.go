//go:build compose

package compose

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// maxCertTTL is the signers' MAX_WORKLOAD_CERT_TTL in the suite (their default TTL is
// secretTTL): a rotation's phase outlasts the longest leaf signed before it, capped
// at this + 1 min, so a new-key rotation passes in minutes.
const maxCertTTL = 2 * time.Minute

// rootCheckInterval is the signers' root check interval in the suite: the check
// installs a rotation's next phase and retires the old root, so it bounds how late
// either comes (the default, 1 h, would hold a 2-minute phase for an hour).
const rootCheckInterval = 5 * time.Second

// retireSlack is the signer's ca.RetireSlack: what each phase adds to the longest
// leaf it must outlast.
const retireSlack = time.Minute

// rotationRoots are the two roots of a new-key rotation and the cross certificate
// (the new key certified by the old root), once seen in a served chain.
type rotationRoots struct {
	old, new *x509.Certificate
	cross    *x509.Certificate
}

// newKeyRotation: the admin rotates the root to a new key (`meshctl rotate root
// -new-key`) with the stack's certificates short (SECRET_TTL 1 min, the signers'
// max 2 min), and the pod is followed through every phase to the old root's
// retirement. Every certificate it serves meanwhile, the last of each phase and the
// first of the next among them, is checked when first seen: its chain has the shape
// of one phase, never an earlier one than before, and verifies, in Go, with `openssl
// verify` and (when the pod's OUTPUT_CERTS hold its key) in real handshakes by
// OpenSSL and BoringSSL, against the pod's own ROOTCA and, while it reaches the old
// root, against the old root alone. Each phase is served; at the end the old root
// has left the bundle and the pod's ROOTCA, and sds-edge never restarted. h.end then
// asserts 0 s of expired certificate served, with the rest of every fault.
func newKeyRotation(t *testing.T, h *harness) {
	// The same-key rotation before this one leaves its old root in the bundle for
	// max TTL + 1 min: start from one root, so that "the old root" is one.
	var old *x509.Certificate
	testkit.EventuallyWithin(t, maxCertTTL+2*retireSlack, "one root in the bundle before the rotation", func() bool {
		roots, err := pki.ParseCertPEMs(bundle(t, h.nc).Roots)
		if err != nil || len(roots) != 1 {
			return false
		}
		old = roots[0]
		return true
	})
	f := h.begin(t, "new-key rotation")
	before := h.restarts(t)
	reply := rotateRoot(t, h.nc, events.RotateRequest{NewKey: true, Reason: "fault suite: new key"})
	rr := &rotationRoots{old: old, new: newRoots(t, reply.Roots, reply.Fingerprint)[0]}
	if rr.new.Equal(old) || bytes.Equal(rr.new.SubjectKeyId, old.SubjectKeyId) {
		t.Fatalf("rotate root -new-key: the new root %s has the old root's key", reply.Fingerprint)
	}
	plan := reply.Plan
	if plan == nil || plan.NewRootLast.IsZero() || plan.Settled.IsZero() || plan.OldRootLeaves.IsZero() {
		t.Fatalf("rotate root -new-key: no plan of phases in the reply: %+v", plan)
	}
	p1, p2, p3 := plan.NewRootLast.Sub(plan.Rotated), plan.Settled.Sub(plan.NewRootLast), plan.OldRootLeaves.Sub(plan.Settled)
	f.note("phases %s / %s / %s (old key's longest leaf %ds)", p1.Round(time.Second), p2.Round(time.Second), p3.Round(time.Second), plan.OldKeyLongest)
	t.Logf("plan: phase 1 from %s, 2 from %s, 3 from %s, old root leaves at %s", plan.Rotated.Format(time.TimeOnly),
		plan.NewRootLast.Format(time.TimeOnly), plan.Settled.Format(time.TimeOnly), plan.OldRootLeaves.Format(time.TimeOnly))
	// The phases follow the leaves issued (SECRET_TTL + the signer's 10 s backdating),
	// never past the signers' maximum + 1 min.
	for i, p := range []time.Duration{p1, p2, p3} {
		if p <= 0 || p > maxCertTTL+retireSlack+5*time.Second {
			t.Errorf("phase %d lasts %s: want at most the signers' max TTL + %s (%s)", i+1, p, retireSlack, maxCertTTL+retireSlack)
		}
	}
	if p1 > secretTTL+10*time.Second+retireSlack+5*time.Second {
		t.Errorf("phase 1 lasts %s: the longest leaf the old key signed lived %s (SECRET_TTL + backdating), so it should be that + %s", p1, secretTTL+10*time.Second, retireSlack)
	}

	// Every certificate the pod serves from now to the old root's retirement is
	// checked when it is first seen: the first of each phase is the phase's boundary
	// as the pod lives it (the plan's times are upper bounds: a phase ends earlier
	// once the leaves issued in it are known to be short).
	rc := faultcheck.RotationChains{Old: old, New: rr.new}
	began := map[int]time.Time{}
	last, checked := faultcheck.ShapeUnknown, map[string]bool{}
	var bundleAsked time.Time
	retired := false
	if !testkit.Poll(time.Until(plan.OldRootLeaves.Add(time.Minute)), func() bool {
		if last == faultcheck.ShapeNewRoot && time.Since(bundleAsked) > 2*time.Second {
			bundleAsked = time.Now()
			retired = h.retiredAt(t, rr.new)
		}
		s := h.probe.Now()
		if s.Cur.Leaf == nil || checked[s.Cur.Serial()] {
			return retired
		}
		checked[s.Cur.Serial()] = true
		shape := rc.Shape(s.Cur.Chain)
		if rr.cross == nil && shape == faultcheck.ShapeCrossOld {
			rr.cross = s.Cur.Chain[1]
		}
		switch {
		case shape == faultcheck.ShapeUnknown:
			t.Errorf("the pod serves %s: a chain of no phase (%s)", s.Cur.Serial(), describe(s.Cur.Chain, rr))
		case shape < last:
			t.Errorf("the pod serves %s, of phase %d, after one of phase %d", s.Cur.Serial(), shape, last)
		case shape > last:
			at, _ := h.probe.FirstServed(s.Cur.Serial())
			began[shape] = at
			t.Logf("phase %d: first served %s after the rotation", shape, at.Sub(plan.Rotated).Round(100*time.Millisecond))
			last = shape
		}
		h.checkServed(t, rr, fmt.Sprintf("phase %d", shape), s)
		return false
	}) {
		t.Fatalf("the old root was not retired by %s (the plan's time + 1 min)", plan.OldRootLeaves.Add(time.Minute).Format(time.TimeOnly))
	}
	for _, shape := range []int{faultcheck.ShapeCrossOld, faultcheck.ShapeCrossNew, faultcheck.ShapeNewRoot} {
		if began[shape].IsZero() {
			t.Errorf("the pod never served a chain of phase %d", shape)
		}
	}
	f.note("phases served from +%s / +%s / +%s; %d certificates checked", began[1].Sub(plan.Rotated).Round(time.Second),
		began[2].Sub(plan.Rotated).Round(time.Second), began[3].Sub(plan.Rotated).Round(time.Second), len(checked))

	// The old root has left the bundle and the pod's ROOTCA.
	gone := time.Now()
	f.note("old root gone from the pod's ROOTCA +%s after the rotation (plan: +%s)", gone.Sub(plan.Rotated).Round(time.Second),
		plan.OldRootLeaves.Sub(plan.Rotated).Round(time.Second))
	h.checkServed(t, rr, "old root gone", h.probe.Now())
	f.heal, f.healFrom = gone.Sub(plan.Rotated), "rotate reply (to the old root's retirement)"
	if after := h.restarts(t); after != before {
		t.Errorf("sds-edge restarted during the rotation: %s -> %s", before, after)
	}
	h.end(t, f)
}

// retiredAt reports whether the bundle and the pod's ROOTCA hold root alone.
func (h *harness) retiredAt(t *testing.T, root *x509.Certificate) bool {
	t.Helper()
	roots, err := pki.ParseCertPEMs(bundle(t, h.nc).Roots)
	s := h.probe.Now()
	return err == nil && len(roots) == 1 && roots[0].Equal(root) && len(s.Cur.Roots) == 1 && s.Cur.Roots[0].Equal(root)
}

// checkServed asserts what the pod serves in s: an unexpired certificate, whose
// chain verifies in Go and with OpenSSL against the pod's ROOTCA, and against the old
// root alone when it reaches the old root (a leaf of the old key, or one followed by
// the cross certificate); and, when the pod's OUTPUT_CERTS hold its key, real
// handshakes by OpenSSL's s_client and BoringSSL's bssl-tool under the same trust.
func (h *harness) checkServed(t *testing.T, rr *rotationRoots, what string, s faultcheck.Sample) {
	t.Helper()
	if s.Cur.Leaf == nil {
		t.Errorf("%s: no certificate served", what)
		return
	}
	if !time.Now().Before(s.Cur.Leaf.NotAfter) {
		t.Errorf("%s: the pod serves %s, expired at %s", what, s.Cur.Serial(), s.Cur.Leaf.NotAfter.Format(time.TimeOnly))
	}
	trusts := []struct {
		name  string
		roots []*x509.Certificate
	}{{"the pod's ROOTCA", s.Cur.Roots}}
	if reachesOld(s.Cur.Chain, rr) {
		trusts = append(trusts, struct {
			name  string
			roots []*x509.Certificate
		}{"the old root alone", []*x509.Certificate{rr.old}})
	}
	key := h.servedKey(s.Cur.Leaf)
	for _, tr := range trusts {
		if err := s.Cur.ChainsTo(tr.roots, time.Now()); err != nil {
			t.Errorf("%s: Go: %s (%s) does not verify under %s: %v", what, s.Cur.Serial(), describe(s.Cur.Chain, rr), tr.name, err)
		}
		if err := testkit.OpenSSLVerifies(t, s.Cur.Chain, tr.roots); err != nil {
			t.Errorf("%s: %s (%s) under %s: %v", what, s.Cur.Serial(), describe(s.Cur.Chain, rr), tr.name, err)
		}
		if key == nil {
			continue
		}
		for _, stack := range []string{testkit.StackOpenSSL, testkit.StackBoringSSL} {
			if err := testkit.ToolAccepts(t, stack, s.Cur.Chain, key, tr.roots); err != nil {
				t.Errorf("%s: handshake presenting %s (%s) under %s: %v", what, s.Cur.Serial(), describe(s.Cur.Chain, rr), tr.name, err)
			}
		}
	}
	t.Logf("%s: %s (%s) verifies in Go and OpenSSL under %d trust stores, handshakes: %v", what, s.Cur.Serial(), describe(s.Cur.Chain, rr), len(trusts), key != nil)
}

// servedKey is the pod's private key from its OUTPUT_CERTS (the host directory the
// suite mounts as the pod's root) when cert-chain.pem there holds leaf; nil when the
// pod has moved on since (the check is then by chain only).
func (h *harness) servedKey(leaf *x509.Certificate) crypto.Signer {
	dir := filepath.Join(h.st.podDir, "etc/certs")
	chain, err := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
	if err != nil {
		return nil
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "key.pem"))
	if err != nil {
		return nil
	}
	certs, err := pki.ParseCertsPEM(chain)
	if err != nil || len(certs) == 0 || !certs[0].Equal(leaf) {
		return nil
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return nil
	}
	// The files are written one after the other: the key must be the leaf's.
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(leaf.PublicKey) {
		return nil
	}
	return key
}

// reachesOld reports whether chain reaches the old root: it ends at it, or holds the
// cross certificate (the old root's certification of the new key).
func reachesOld(chain []*x509.Certificate, rr *rotationRoots) bool {
	for _, c := range chain[1:] {
		if c.Equal(rr.old) || (rr.cross != nil && c.Equal(rr.cross)) {
			return true
		}
	}
	return false
}

// describe names the certificates above a leaf: old root, new root, cross.
func describe(chain []*x509.Certificate, rr *rotationRoots) string {
	var b bytes.Buffer
	for i, c := range chain {
		if i > 0 {
			b.WriteString(", ")
		}
		switch {
		case c.Equal(rr.old):
			b.WriteString("old root")
		case c.Equal(rr.new):
			b.WriteString("new root")
		case rr.cross != nil && c.Equal(rr.cross):
			b.WriteString("cross")
		case c.IsCA:
			fmt.Fprintf(&b, "CA %s", pki.Fingerprint(c)[:12])
		default:
			b.WriteString("leaf")
		}
	}
	return b.String()
}

// rotateRoot asks the signers to rotate the root, as `meshctl rotate root` does.
func rotateRoot(t *testing.T, nc *nats.Conn, req events.RotateRequest) events.RotateReply {
	t.Helper()
	msg, err := events.NewMsg(events.SubjectRootRotate, "fault-suite", req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := nc.RequestMsg(msg, 30*time.Second)
	if err != nil {
		t.Fatalf("rotate root: %v", err)
	}
	reply, _, err := events.Decode[events.RotateReply](resp)
	if err != nil || reply.Error != nil {
		t.Fatalf("rotate root: %v %v", err, reply.Error)
	}
	return reply
}
