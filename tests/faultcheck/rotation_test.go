package faultcheck

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

func TestRotationChainsTellEachPhaseApart(t *testing.T) {
	now := time.Now()
	r := testkit.NewRotation(t, now, time.Hour)
	rc := RotationChains{Old: r.Old.Cert, New: r.New.Cert}
	chain := func(phase int) []*x509.Certificate {
		leaf := r.Signer(phase).Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/a/sa/b"})
		return append([]*x509.Certificate{leaf.Cert}, r.Above(phase)...)
	}
	for phase, want := range map[int]int{testkit.PhaseBefore: ShapeOldKey, testkit.PhaseOldLast: ShapeCrossOld,
		testkit.PhaseNewLast: ShapeCrossNew, testkit.PhaseSettled: ShapeNewRoot} {
		c := chain(phase)
		if got := rc.Shape(c); got != want {
			t.Errorf("phase %d: shape %d, want %d", phase, got, want)
		}
		if got := rc.ReachesOld(c); got != (want != ShapeNewRoot) {
			t.Errorf("phase %d: reaches the old root %v", phase, got)
		}
	}
	other := testkit.NewCA(t, "meshagent root CA", nil, now, time.Hour)
	leaf := r.New.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/a/sa/b"})
	for name, c := range map[string][]*x509.Certificate{
		"leaf alone":                {leaf.Cert},
		"new-key leaf, old root":    {leaf.Cert, r.Old.Cert},
		"cross, then another root":  {leaf.Cert, r.Cross, other.Cert},
		"a leaf of an unrelated CA": {other.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/a/sa/b"}).Cert, r.New.Cert},
		"the new root as the cross": {leaf.Cert, r.New.Cert, r.Old.Cert},
	} {
		if got := rc.Shape(c); got != ShapeUnknown {
			t.Errorf("%s: shape %d, want unknown", name, got)
		}
	}
}
