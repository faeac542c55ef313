package cli

import (
	"bytes"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/tests/testkit"
)

// meshctl inspect verifies every chain shape the signer returns across a rotation
// to a new key against the bundle of that phase, as a pod's cert-chain.pem holds it
// (the reply, root included) and without the root; a leaf of a key the bundle does
// not hold is reported as not verifying.
func TestInspectVerifiesEveryRotationPhase(t *testing.T) {
	now := time.Now()
	rot := testkit.NewRotation(t, now, 24*time.Hour)
	for phase := testkit.PhaseBefore; phase <= testkit.PhaseSettled; phase++ {
		leaf := rot.Signer(phase).Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/default/sa/web"})
		reply := append([]*x509.Certificate{leaf.Cert}, rot.Above(phase)...)
		for _, cs := range [][]*x509.Certificate{reply, reply[:len(reply)-1]} {
			var out bytes.Buffer
			if !describeChain(&out, cs, inventory.Cert{}, rot.Bundle(phase), 2, now) {
				t.Errorf("phase %d, %d certificates: does not verify:\n%s", phase, len(cs), out.String())
			}
		}
	}
	// After the old root left the bundle, a leaf the old key signed does not verify.
	old := rot.Old.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/default/sa/web"})
	var out bytes.Buffer
	if describeChain(&out, []*x509.Certificate{old.Cert, rot.Old.Cert}, inventory.Cert{}, []*x509.Certificate{rot.New.Cert}, 3, now) ||
		!strings.Contains(out.String(), "verifies    NO") {
		t.Fatalf("a leaf under the retired key verified:\n%s", out.String())
	}
}

// The plan says what each phase lasts for: the longest certificates actually signed.
func TestPlanSaysWhatThePhasesLastFor(t *testing.T) {
	rotated := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	day := int64((24*time.Hour + 10*time.Second) / time.Second)
	six := int64((6*time.Hour + 10*time.Second) / time.Second)
	p := &events.RotationPlan{Phase: 1, Rotated: rotated,
		NewRootLast:   rotated.Add(time.Duration(day)*time.Second + time.Minute),
		OldKeyLongest: day, Phase1Longest: six}
	p.Settled = p.NewRootLast.Add(time.Duration(six)*time.Second + time.Minute)
	p.OldRootLeaves = p.Settled.Add(time.Duration(six)*time.Second + time.Minute)
	var out bytes.Buffer
	printPlan(Env{Stdout: &out}, "plan", p)
	for _, want := range []string{"phase 1 lasts 24h1m10s", "old key signed lives 24h0m10s", "phase 2 lasts 6h1m10s", "phase 1 (so far) lives 6h0m10s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, out.String())
		}
	}
}

// meshctl status's rotation row says the phase now, when the next begins and when
// the old root leaves, from the signer's live plan.
func TestRotationPhaseLine(t *testing.T) {
	rotated := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	p := &events.RotationPlan{Phase: 1, Rotated: rotated, NewRootLast: rotated.Add(time.Hour),
		Settled: rotated.Add(2 * time.Hour), OldRootLeaves: rotated.Add(3 * time.Hour)}
	for _, tc := range []struct {
		name string
		p    *events.RotationPlan
		now  time.Time
		want []string
	}{
		{"plugged-in", nil, rotated, []string{"does not rotate"}},
		{"nothing rotated", &events.RotationPlan{}, rotated, []string{"none under way"}},
		{"phase 1", p, rotated.Add(10 * time.Minute), []string{"phase 1 of 3", "rotated 10m ago", "phase 2", "in 50m", "old root leaves the bundle", "in 2h 50m"}},
		{"phase 2", &events.RotationPlan{Phase: 2, Rotated: p.Rotated, NewRootLast: p.NewRootLast, Settled: p.Settled, OldRootLeaves: p.OldRootLeaves},
			rotated.Add(90 * time.Minute), []string{"phase 2 of 3", "phase 3", "in 30m"}},
		{"same key", &events.RotationPlan{Rotated: rotated, NewRootLast: rotated, Settled: rotated, OldRootLeaves: rotated.Add(time.Hour)},
			rotated.Add(time.Minute), []string{"same key", "in 59m"}},
		{"done", p, rotated.Add(4 * time.Hour), []string{"done", "old root left"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := rotationPhase(tc.p, tc.now)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q lacks %q", line, w)
				}
			}
		})
	}
}
