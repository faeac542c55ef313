package ca

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// On a fleet of 24 h certificates under a 90-day -max-ttl, a rotation to a new key
// takes days, not months: phase 1 lasts as long as the longest leaf the old key
// signed, phase 2 as long as the longest signed in phase 1, and the old root leaves
// one longest-leaf later. Every leaf signed before a boundary has expired at it. The
// dry run says so before the rotation, and a second replica keeps the same plan.
func TestPhasesFollowTheLeavesActuallyIssued(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	r := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	r.src.cfg.RootTTL = 1000 * 24 * time.Hour
	r.src.cfg.MaxLeafTTL = 90 * 24 * time.Hour
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	other := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	other.src.cfg = r.src.cfg
	if err := other.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	other.run(t)

	// sign notes the lifetime as the issuer does, then signs; it returns NotAfter.
	sign := func(rep *replica, ttl time.Duration) time.Time {
		t.Helper()
		if err := rep.src.NoteLife(ctx, ttl+Backdate); err != nil {
			t.Fatal(err)
		}
		id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/web")
		leaf, err := rep.auth.Current().SignLeaf(mustKey(t).Public(), id, fake.Now(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		return leaf.NotAfter
	}
	var oldLeaves []time.Time
	for _, ttl := range []time.Duration{time.Hour, 24 * time.Hour, 12 * time.Hour} {
		oldLeaves = append(oldLeaves, sign(other, ttl)) // the longest by the other replica
		fake.Add(time.Hour)
	}
	plan, err := r.src.RotationPlan(ctx, true, true)
	if err != nil {
		t.Fatal(err)
	}
	day := 24*time.Hour + Backdate
	if plan.OldKeyLongest != int64(day/time.Second) || !plan.NewRootLast.Equal(fake.Now().Add(day+RetireSlack)) {
		t.Fatalf("dry run: old key's longest %ds, phase 2 at %s (now %s)", plan.OldKeyLongest, plan.NewRootLast, fake.Now())
	}
	if _, err := r.src.Rotate(ctx, true); err != nil {
		t.Fatal(err)
	}
	rotAt := fake.Now()
	var phase1Leaves []time.Time
	for _, ttl := range []time.Duration{6 * time.Hour, 2 * time.Hour} {
		phase1Leaves = append(phase1Leaves, sign(r, ttl))
		fake.Add(time.Hour)
	}
	p := r.src.Plan()
	six := 6*time.Hour + Backdate
	if !p.NewLast.Equal(rotAt.Add(day+RetireSlack)) || !p.Settled.Equal(p.NewLast.Add(six+RetireSlack)) ||
		!p.OldLeave.Equal(p.Settled.Add(six+RetireSlack)) {
		t.Fatalf("plan %+v (rotated %s)", p, rotAt)
	}
	if p.OldLeave.Sub(rotAt) > 3*24*time.Hour {
		t.Fatalf("the rotation takes %s", p.OldLeave.Sub(rotAt))
	}
	testkit.EventuallyWithin(t, 30*time.Second, "the other replica has the same plan", func() bool {
		return other.src.Plan() == p
	})
	for _, na := range oldLeaves {
		if !na.Before(p.NewLast) {
			t.Fatalf("a leaf of the old key is valid until %s, phase 2 begins at %s", na, p.NewLast)
		}
	}
	for _, na := range phase1Leaves {
		if !na.Before(p.Settled) {
			t.Fatalf("a phase-1 leaf is valid until %s, phase 3 begins at %s", na, p.Settled)
		}
	}
	for _, c := range []struct {
		at   time.Time
		want Phase
	}{
		{p.NewLast.Add(-time.Second), PhaseCrossOldLast}, {p.NewLast, PhaseCrossNewLast},
		{p.Settled.Add(-time.Second), PhaseCrossNewLast}, {p.Settled, PhaseSettled},
	} {
		fake.Set(c.at)
		if err := r.src.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if got := r.auth.Current().Phase(); got != c.want {
			t.Fatalf("at %s: phase %s, want %s", c.at, got, c.want)
		}
		if c.want == PhaseCrossNewLast {
			sign(r, 10*time.Hour) // longer than phase 1's: the old root stays longer, phase 2 ends as planned
			if got := r.src.Plan(); !got.Settled.Equal(p.Settled) || !got.OldLeave.Equal(p.Settled.Add(10*time.Hour+Backdate+RetireSlack)) {
				t.Fatalf("after a longer leaf in phase 2: settled %s (was %s), old root leaves %s", got.Settled, p.Settled, got.OldLeave)
			}
		}
	}
	fake.Set(r.src.Plan().OldLeave)
	if err := r.src.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if m := r.auth.Current(); len(m.Roots) != 1 {
		t.Fatalf("%d roots after the old root's time to leave", len(m.Roots))
	}
}
