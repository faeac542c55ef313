package ca

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// agent is a pod as an Istio agent leaves it after a CreateCertificate reply: it
// presents the reply without its last PEM and trusts that last PEM alone.
type agent struct {
	name      string
	presented []*x509.Certificate // leaf first
	trust     *x509.Certificate
}

func replyAgent(t *testing.T, name string, m *Material, now time.Time) agent {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/" + name)
	leaf, err := m.SignLeaf(key.Public(), id, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	reply := append([]*x509.Certificate{leaf}, m.Chain...)
	return agent{name: name, presented: reply[:len(reply)-1], trust: reply[len(reply)-1]}
}

// accepts reports whether a accepts b's certificate at now, as a TLS peer would.
func (a agent) accepts(b agent, now time.Time) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(a.trust)
	for _, c := range b.presented[1:] {
		inter.AddCert(c)
	}
	_, err := b.presented[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err
}

// Across a rotation to a new key, a pod renews every ten minutes somewhere in the
// mesh; at every step each two pods whose certificates are still valid, each
// trusting only the last PEM of its own reply, accept each other both ways. The
// phases move at PhaseStep and 2×PhaseStep after the rotation, without a new
// generation (no trust.changed), alike on a second replica; the old root leaves the
// bundle at 3×PhaseStep, announced once as root-retired, and the cross-signed
// certificate and old key leave KV with it.
func TestRotationPhasesKeepEveryTwoPodsTalking(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	r := newReplica(t, js, fake)
	r.src.cfg.RootTTL = 100 * 24 * time.Hour
	r.src.cfg.MaxLeafTTL = time.Hour
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
	old := r.auth.Current()

	var pods []agent
	var born []time.Time
	renew := func(name string) {
		pods = append(pods, replyAgent(t, name, r.auth.Current(), fake.Now()))
		born = append(born, fake.Now())
	}
	for i := range 6 { // the mesh before: a pod renewed every ten minutes
		renew(fmt.Sprintf("before-%d", i))
		fake.Add(10 * time.Minute)
	}
	rotated, err := r.src.Rotate(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	rotAt := fake.Now()
	step := r.src.PhaseStep()
	plan := r.src.Plan()
	if plan.Phase != PhaseCrossOldLast || !plan.NewLast.Equal(rotAt.Add(step)) || !plan.Settled.Equal(rotAt.Add(2*step)) || !plan.OldLeave.Equal(rotAt.Add(3*step)) {
		t.Fatalf("plan %+v, rotated at %s, step %s", plan, rotAt, step)
	}
	if len(rotated.Chain) != 2 || !rotated.Chain[1].Equal(old.Roots[0]) {
		t.Fatalf("phase 1: the chain must end at the old root")
	}
	testkit.EventuallyWithin(t, 30*time.Second, "the second replica follows the rotation", func() bool {
		return other.auth.Current().Generation == rotated.Generation
	})

	wantPhase := func(at time.Time) Phase {
		switch {
		case at.Before(rotAt.Add(step)):
			return PhaseCrossOldLast
		case at.Before(rotAt.Add(2 * step)):
			return PhaseCrossNewLast
		}
		return PhaseSettled
	}
	for i := 0; fake.Now().Before(rotAt.Add(3*step + 10*time.Minute)); i++ {
		now := fake.Now()
		for _, rep := range []*replica{r, other} {
			if err := rep.src.Check(ctx); err != nil {
				t.Fatal(err)
			}
		}
		m := r.auth.Current()
		if got, want := m.Phase(), wantPhase(now); got != want {
			t.Fatalf("%s after the rotation: phase %s, want %s", now.Sub(rotAt), got, want)
		}
		if o := other.auth.Current(); o.Generation != m.Generation || fmt.Sprint(o.ChainPEMs()) != fmt.Sprint(m.ChainPEMs()) {
			t.Fatalf("%s after the rotation: the replicas reply with different chains (gen %d, %d)", now.Sub(rotAt), m.Generation, o.Generation)
		}
		leaves := now.Before(rotAt.Add(3 * step))
		if has := len(m.Roots) == 2; has != leaves {
			t.Fatalf("%s after the rotation: %d roots in the bundle", now.Sub(rotAt), len(m.Roots))
		}
		if !leaves && m.Generation != rotated.Generation+1 || leaves && m.Generation != rotated.Generation {
			t.Fatalf("%s after the rotation: generation %d (rotation %d): a phase change must not be a new generation", now.Sub(rotAt), m.Generation, rotated.Generation)
		}
		renew(fmt.Sprintf("after-%d", i))
		for a := range pods {
			for b := range pods {
				if a == b || !now.Before(born[a].Add(time.Hour)) || !now.Before(born[b].Add(time.Hour)) {
					continue // one of them has expired, so renewed: a later pod
				}
				if err := pods[a].accepts(pods[b], now); err != nil {
					t.Errorf("%s after the rotation (phase %s): %s does not accept %s: %v", now.Sub(rotAt), m.Phase(), pods[a].name, pods[b].name, err)
				}
			}
		}
		fake.Add(10 * time.Minute)
	}
	eventuallyAnnounced(t, fake, 2, "trust.changed root-retired", func() bool {
		all := r.rec.all()
		return len(all) > 0 && all[len(all)-1].Reason == events.TrustReasonRetired
	})
	retired := 0
	for _, tc := range r.rec.all() {
		if tc.Reason == events.TrustReasonRetired {
			retired++
		}
	}
	if retired != 1 {
		t.Fatalf("%d root-retired announcements, want 1", retired)
	}
	var st stored
	if err := json.Unmarshal(kvValue(t, js).Value(), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Keys) != 1 || st.Cross != "" || len(st.Roots) != 1 {
		t.Fatalf("kv after the old root left: %d keys, cross %t, %d roots", len(st.Keys), st.Cross != "", len(st.Roots))
	}
}

// Without the phases (the chain ending at the new root at once) a pod that renewed
// before the rotation and one that renewed after cannot talk: what the phases fix.
func TestWithoutPhasesTheMeshSplits(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	r := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	r.src.cfg.RootTTL = 100 * 24 * time.Hour
	r.src.cfg.MaxLeafTTL = time.Hour
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	before := replyAgent(t, "before", r.auth.Current(), fake.Now())
	m, err := r.src.Rotate(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	naive := *m
	naive.Chain = m.Roots[:1] // new root last, no cross-signed certificate
	after := replyAgent(t, "after", &naive, fake.Now())
	if before.accepts(after, fake.Now()) == nil || after.accepts(before, fake.Now()) == nil {
		t.Fatal("the naive chain verified: the test does not model the split")
	}
	phased := replyAgent(t, "phased", m, fake.Now())
	if err := before.accepts(phased, fake.Now()); err != nil {
		t.Fatal(err)
	}
	if err := phased.accepts(before, fake.Now()); err != nil {
		t.Fatal(err)
	}
}

// After a same-key rotation the old root leaves the bundle one PhaseStep (max leaf
// TTL + RetireSlack) after it retired, announced as root-retired.
func TestSameKeyRotationRetiresAfterOneStep(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	r := newReplica(t, js, fake)
	r.src.cfg.RootTTL = 100 * 24 * time.Hour
	r.src.cfg.MaxLeafTTL = time.Hour
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	old := r.auth.Current()
	m, err := r.src.Rotate(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if m.Phase() != PhaseSettled || len(m.Chain) != 1 {
		t.Fatalf("same-key rotation: phase %s, chain of %d", m.Phase(), len(m.Chain))
	}
	fake.Add(time.Hour + RetireSlack - time.Second)
	if err := r.src.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.auth.Current(); got.Generation != m.Generation || len(got.Roots) != 2 {
		t.Fatalf("old root left too early: gen %d, %d roots", got.Generation, len(got.Roots))
	}
	fake.Add(2 * time.Second)
	if err := r.src.Check(ctx); err != nil {
		t.Fatal(err)
	}
	got := r.auth.Current()
	if got.Generation != m.Generation+1 || len(got.Roots) != 1 || got.RootFingerprint() != m.RootFingerprint() {
		t.Fatalf("after retirement: gen %d, %d roots", got.Generation, len(got.Roots))
	}
	testkit.EventuallyWithin(t, 30*time.Second, "trust.changed root-retired", func() bool {
		all := r.rec.all()
		return len(all) > 0 && all[len(all)-1].Generation == got.Generation
	})
	all := r.rec.all()
	if tc := all[len(all)-1]; tc.Reason != events.TrustReasonRetired || len(tc.Removed) != 1 || tc.Removed[0] != old.RootFingerprint() {
		t.Fatalf("trust.changed %+v", tc)
	}
}

// A same-key rotation during the phases keeps them: the cross-signed certificate,
// the old root as the last PEM in phase 1 and the phases' clock; a new key is
// refused until they end.
func TestSameKeyRotationDuringPhasesKeepsThem(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	r := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	r.src.cfg.RootTTL = 100 * 24 * time.Hour
	r.src.cfg.MaxLeafTTL = time.Hour
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	before := replyAgent(t, "before", r.auth.Current(), fake.Now())
	first, err := r.src.Rotate(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	plan := r.src.Plan()
	fake.Add(10 * time.Minute)
	m, err := r.src.Rotate(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if m.Phase() != PhaseCrossOldLast || !m.Chain[1].Equal(first.Chain[1]) || len(m.Roots) != 3 {
		t.Fatalf("same-key rotation in phase 1: phase %s, %d roots", m.Phase(), len(m.Roots))
	}
	if got := r.src.Plan(); !got.NewLast.Equal(plan.NewLast) || !got.OldLeave.Equal(plan.OldLeave) {
		t.Fatalf("plan moved: %+v, was %+v", got, plan)
	}
	after := replyAgent(t, "after", m, fake.Now())
	if err := before.accepts(after, fake.Now()); err != nil {
		t.Fatal(err)
	}
	if err := after.accepts(before, fake.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.src.Rotate(ctx, true); !errors.Is(err, ErrRotateTooSoon) {
		t.Fatalf("a new key during the phases: %v", err)
	}
}

// TestRootChecksComeAtPhaseBoundaries: the root check, which installs each phase of
// a rotation to a new key, is due at the next boundary (plus a little slack) when
// that comes before -root-check-interval, and at the interval once the rotation is
// settled — a phase never waits up to an interval past its time.
func TestRootChecksComeAtPhaseBoundaries(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	cfg := selfSignedCfg()
	cfg.MaxLeafTTL = 2 * time.Minute
	cfg.RootTTL = 24 * time.Hour // no rotation of its own while the test steps the clock
	r := &replica{auth: &Authority{}, rec: &recorder{}}
	r.src = NewSelfSigned(cfg, bustest.JetStream(t, bustest.Conn(t, s)), r.auth, r.rec.notify, hclog.NewNullLogger(), fake)
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if d := r.src.nextCheck(); d != cfg.CheckInterval {
		t.Fatalf("before any rotation the check is due in %s, want the interval %s", d, cfg.CheckInterval)
	}
	fake.Add(time.Minute)
	if _, err := r.src.Rotate(ctx, true); err != nil {
		t.Fatal(err)
	}
	p := r.src.Plan()
	if p.NewLast.IsZero() || !p.NewLast.Before(p.Settled) {
		t.Fatalf("plan %+v", p)
	}
	for _, boundary := range []time.Time{p.NewLast, p.Settled, p.OldLeave} {
		if want := boundary.Sub(fake.Now()) + boundarySlack; r.src.nextCheck() != want {
			t.Fatalf("at %s the check is due in %s, want %s (the boundary at %s)", fake.Now(), r.src.nextCheck(), want, boundary)
		}
		fake.Set(boundary.Add(time.Second))
		if err := r.src.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d := r.src.nextCheck(); d != cfg.CheckInterval {
		t.Fatalf("after the old root left the check is due in %s, want the interval (plan %+v, now %s)", d, r.src.Plan(), fake.Now())
	}
}
