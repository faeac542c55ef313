package trustbundle

import (
	"crypto"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

const td = "cluster.local"

// root is a self-signed test root valid for a day.
func root(t *testing.T, name string) *testkit.CA {
	return testkit.NewCA(t, name, nil, time.Now(), 24*time.Hour)
}

// bundle builds a bundle of roots at gen, endorsed by each of by (chain: the
// endorsing certificates, when by is an intermediate).
func bundle(t *testing.T, gen uint64, roots []*x509.Certificate, by []crypto.Signer, chain ...*x509.Certificate) Bundle {
	t.Helper()
	b := Bundle{TrustDomain: td, Generation: gen, Roots: pki.CertPEMs(roots)}
	var err error
	if b.Endorsements, err = Endorse(td, gen, b.Roots, by...); err != nil {
		t.Fatal(err)
	}
	for i := range b.Endorsements {
		b.Endorsements[i].Chain = pki.CertPEMs(chain)
	}
	return b
}

func certs(as ...*testkit.CA) []*x509.Certificate {
	out := make([]*x509.Certificate, len(as))
	for i, a := range as {
		out[i] = a.Cert
	}
	return out
}

func keys(as ...*testkit.CA) []crypto.Signer {
	out := make([]crypto.Signer, len(as))
	for i, a := range as {
		out[i] = a.Key
	}
	return out
}

func fps(cs []*x509.Certificate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = pki.Fingerprint(c)
	}
	return out
}

func equalRoots(t *testing.T, s *Set, want ...*testkit.CA) {
	t.Helper()
	got, w := fps(s.Roots()), fps(certs(want...))
	if len(got) != len(w) {
		t.Fatalf("%d roots trusted, want %d", len(got), len(w))
	}
	for i := range got {
		if got[i] != w[i] {
			t.Fatalf("root %d differs from the one wanted (newest first)", i)
		}
	}
}

func TestFirstUseThenOnlyEndorsed(t *testing.T) {
	r0, evil := root(t, "r0"), root(t, "evil")
	s := New(td, nil, nil)
	if s.Mode() != FirstUse {
		t.Fatalf("mode %s", s.Mode())
	}
	u, changed, err := s.Accept(bundle(t, 1, certs(r0), nil))
	if err != nil || !changed || !u.FirstUse {
		t.Fatalf("first bundle: first use %v changed %v err %v", u.FirstUse, changed, err)
	}
	for _, tc := range []struct {
		name string
		b    Bundle
	}{
		{"unendorsed", bundle(t, 2, certs(evil, r0), nil)},
		{"endorsed by its own key", bundle(t, 2, certs(evil, r0), keys(evil))},
		{"endorsement of other bytes", func() Bundle {
			b := bundle(t, 2, certs(r0), keys(r0))
			b.Roots = pki.CertPEMs(certs(evil, r0))
			return b
		}()},
		{"generation changed after endorsing", func() Bundle { b := bundle(t, 2, certs(evil, r0), keys(r0)); b.Generation = 3; return b }()},
		{"wrong trust domain", func() Bundle { b := bundle(t, 2, certs(r0), keys(r0)); b.TrustDomain = "evil.org"; return b }()},
		{"bad key id", func() Bundle { b := bundle(t, 2, certs(r0), keys(r0)); b.Endorsements[0].KeyID = "00"; return b }()},
		{"garbled signature", func() Bundle { b := bundle(t, 2, certs(r0), keys(r0)); b.Endorsements[0].Signature = "!"; return b }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := s.Accept(tc.b); !errors.Is(err, ErrRejected) {
				t.Fatalf("accepted: %v", err)
			}
			equalRoots(t, s, r0)
			if s.Generation() != 1 {
				t.Fatalf("generation %d after a rejected bundle", s.Generation())
			}
		})
	}
}

func TestRotations(t *testing.T) {
	r0 := root(t, "r0")
	s := New(td, nil, nil)
	if _, _, err := s.Accept(bundle(t, 1, certs(r0), keys(r0))); err != nil {
		t.Fatal(err)
	}
	// Same key, new certificate.
	r1 := testkit.SelfSigned(t, testkit.Spec{IsCA: true, Key: r0.Key, Life: 24 * time.Hour}).CA()
	if _, changed, err := s.Accept(bundle(t, 2, certs(r1, r0), keys(r1))); err != nil || !changed {
		t.Fatalf("same-key rotation: changed %v err %v", changed, err)
	}
	// New key, announced under the old one (and its own, which does not count yet).
	r2 := root(t, "r2")
	if _, changed, err := s.Accept(bundle(t, 3, certs(r2, r1, r0), keys(r2, r1))); err != nil || !changed {
		t.Fatalf("new-key rotation: changed %v err %v", changed, err)
	}
	equalRoots(t, s, r2, r1, r0)
	// Replay of an older generation: stale, nothing changes.
	u, changed, err := s.Accept(bundle(t, 2, certs(r1, r0), keys(r1)))
	if err != nil || changed || !u.Stale {
		t.Fatalf("replay: stale %v changed %v err %v", u.Stale, changed, err)
	}
	// Removed applies to roots the bundle does not list, never to those it does.
	b := bundle(t, 4, certs(r2, r1), keys(r2))
	b.Removed = fps(certs(r0, r2))
	if _, _, err := s.Accept(b); err != nil {
		t.Fatal(err)
	}
	equalRoots(t, s, r2, r1)
}

func TestIntermediateEndorses(t *testing.T) {
	r0 := root(t, "r0")
	mid := testkit.NewCA(t, "intermediate", r0, time.Now(), 12*time.Hour)
	s := New(td, certs(r0), nil)
	if s.Mode() != Anchors {
		t.Fatalf("mode %s", s.Mode())
	}
	if _, _, err := s.Accept(bundle(t, 1, certs(r0), keys(mid), mid.Cert)); err != nil {
		t.Fatal(err)
	}
	other := root(t, "other")
	otherMid := testkit.NewCA(t, "intermediate", other, time.Now(), 12*time.Hour)
	if _, _, err := s.Accept(bundle(t, 2, certs(other, r0), keys(otherMid), otherMid.Cert)); !errors.Is(err, ErrRejected) {
		t.Fatalf("an intermediate of another root endorsed: %v", err)
	}
	leaf := mid.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/a/sa/b"})
	if err := s.VerifyChain([]*x509.Certificate{leaf.Cert, mid.Cert, r0.Cert}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	// The root it verified to, named once, whether or not the chain carries it.
	for _, chain := range [][]*x509.Certificate{{leaf.Cert, mid.Cert, r0.Cert}, {leaf.Cert, mid.Cert}} {
		if roots, err := s.VerifyChainRoots(chain, nil, time.Now()); err != nil || len(roots) != 1 || !roots[0].Equal(r0.Cert) {
			t.Fatalf("roots of a %d-certificate chain: %d, %v", len(chain), len(roots), err)
		}
	}
	evilLeaf := otherMid.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/a/sa/b"})
	if err := s.VerifyChain([]*x509.Certificate{evilLeaf.Cert, otherMid.Cert, other.Cert}, nil, time.Now()); !errors.Is(err, ErrUntrustedChain) {
		t.Fatalf("leaf under an untrusted root verified: %v", err)
	}
}

func TestAnchorsBootstrap(t *testing.T) {
	anchor, evil, r1 := root(t, "anchor"), root(t, "evil"), root(t, "r1")
	for _, tc := range []struct {
		name string
		b    Bundle
		ok   bool
	}{
		{"endorsed by the anchor", bundle(t, 5, certs(r1, anchor), keys(anchor)), true},
		{"only the anchor, unendorsed", bundle(t, 5, certs(anchor), nil), true},
		{"the anchor and another root, unendorsed", bundle(t, 5, certs(evil, anchor), nil), false},
		{"endorsed by another root", bundle(t, 5, certs(evil), keys(evil)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(td, certs(anchor), nil)
			_, _, err := s.Accept(tc.b)
			if (err == nil) != tc.ok || s.Bootstrapped() != tc.ok {
				t.Fatalf("err %v, bootstrapped %v, want ok %v", err, s.Bootstrapped(), tc.ok)
			}
		})
	}
}

func TestExpiredRootsAreDropped(t *testing.T) {
	r0 := root(t, "r0")
	short := testkit.NewCA(t, "short", nil, time.Now(), time.Minute)
	clk := clock.NewFake(time.Now())
	s := New(td, nil, clk)
	if _, _, err := s.Accept(bundle(t, 1, certs(r0, short), nil)); err != nil {
		t.Fatal(err)
	}
	clk.Add(2 * time.Minute)
	equalRoots(t, s, r0)
	if s.Has(pki.Fingerprint(short.Cert)) {
		t.Fatal("expired root still trusted")
	}
	// An expired root endorses nothing.
	if _, _, err := s.Accept(bundle(t, 2, certs(r0, short), keys(short))); !errors.Is(err, ErrRejected) {
		t.Fatalf("endorsed by an expired root: %v", err)
	}
}

// A root offered without an endorsement (Istio's reply) is trusted only when a
// certificate in the chain certifies its key under a trusted root: the cross-signed
// certificate of a rotation. A stranger's root, with a "cross" certificate it made
// itself, is refused and the set does not change.
func TestCertifiedTakesOnlyACrossSignedRoot(t *testing.T) {
	now := time.Now()
	rot := testkit.NewRotation(t, now, time.Hour)
	s := New("cluster.local", nil, nil)
	if _, err := s.Check(Bundle{TrustDomain: "cluster.local", Roots: pki.CertPEMs([]*x509.Certificate{rot.Old.Cert})}); err != nil {
		t.Fatal(err)
	}
	s.Apply(Update{Roots: []*x509.Certificate{rot.Old.Cert}})
	leaf := rot.New.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/a/sa/b"}).Cert
	got, err := s.Certified(append([]*x509.Certificate{leaf}, rot.Above(testkit.PhaseNewLast)...), nil, now)
	if err != nil || len(got) != 1 || !got[0].Equal(rot.New.Cert) {
		t.Fatalf("phase 2 chain: certified %d roots, %v", len(got), err)
	}
	if got, err := s.Certified(append([]*x509.Certificate{leaf}, rot.Above(testkit.PhaseOldLast)...), nil, now); err != nil || len(got) != 0 {
		t.Fatalf("phase 1 chain ends at a trusted root: %d, %v", len(got), err)
	}

	evil := testkit.NewRotation(t, now, time.Hour) // its "old root" is no root of ours
	evilLeaf := evil.New.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/a/sa/b"}).Cert
	if got, err := s.Certified(append([]*x509.Certificate{evilLeaf}, evil.Above(testkit.PhaseNewLast)...), nil, now); !errors.Is(err, ErrNotCertified) || len(got) != 0 {
		t.Fatalf("a stranger's cross chain: %d roots, %v", len(got), err)
	}
	if got, err := s.Certified([]*x509.Certificate{leaf, evil.New.Cert}, nil, now); !errors.Is(err, ErrNotCertified) || len(got) != 0 {
		t.Fatalf("a stranger's root alone: %d roots, %v", len(got), err)
	}
	if roots := s.Roots(); len(roots) != 1 || !roots[0].Equal(rot.Old.Cert) {
		t.Fatalf("the set changed: %d roots", len(roots))
	}
	if !s.AddCertified([]*x509.Certificate{rot.New.Cert}) || len(s.Roots()) != 2 || s.Generation() != 0 {
		t.Fatalf("AddCertified: %d roots, generation %d", len(s.Roots()), s.Generation())
	}
}

// A Whole bundle (the signer's gRPC header) removes what it leaves out, once its
// endorsement verifies: a retired root leaves with the next generation. One
// endorsed by a key nobody trusts, or not endorsed at all, changes nothing; the
// same bundle not marked Whole only adds (the positive control of the removal).
func TestWholeBundleRemovesWhatItLeavesOut(t *testing.T) {
	oldRoot, newRoot, evil := root(t, "old"), root(t, "new"), root(t, "evil")
	start := func() *Set {
		s := New(td, certs(oldRoot), nil)
		if _, _, err := s.Accept(bundle(t, 1, certs(newRoot, oldRoot), keys(newRoot, oldRoot))); err != nil {
			t.Fatal(err)
		}
		equalRoots(t, s, newRoot, oldRoot)
		return s
	}
	retired := bundle(t, 2, certs(newRoot), keys(newRoot))

	merged := start()
	if _, _, err := merged.Accept(retired); err != nil {
		t.Fatal(err)
	}
	equalRoots(t, merged, newRoot, oldRoot)

	s := start()
	for _, bad := range []struct {
		name string
		b    Bundle
	}{
		{"endorsed by an untrusted key", bundle(t, 2, certs(newRoot), keys(evil))},
		{"not endorsed", bundle(t, 2, certs(newRoot), nil)},
		{"another domain's", func() Bundle { b := retired; b.TrustDomain = "other.local"; return b }()},
	} {
		b := bad.b
		b.Whole = true
		if _, _, err := s.Accept(b); !errors.Is(err, ErrRejected) {
			t.Fatalf("%s: accepted (%v)", bad.name, err)
		}
		equalRoots(t, s, newRoot, oldRoot)
	}
	whole := retired
	whole.Whole = true
	u, changed, err := s.Accept(whole)
	if err != nil || !changed {
		t.Fatalf("whole bundle: changed %t, %v", changed, err)
	}
	if len(u.Removed) != 1 || u.Removed[0] != pki.Fingerprint(oldRoot.Cert) {
		t.Fatalf("removed %v, want the old root", u.Removed)
	}
	equalRoots(t, s, newRoot)
	// An older whole bundle (a replay holding the old root) is stale news.
	replay := bundle(t, 1, certs(newRoot, oldRoot), keys(newRoot, oldRoot))
	replay.Whole = true
	if u, changed, err := s.Accept(replay); err != nil || changed || !u.Stale {
		t.Fatalf("replay: stale %t, changed %t, %v", u.Stale, changed, err)
	}
	equalRoots(t, s, newRoot)
}

// Before the first bundle, a bundle of nothing but anchors is taken unendorsed
// (they are trusted already), but a Whole one is not: it would drop the anchors it
// leaves out, and only the CA's endorsement may say which.
func TestWholeBundleOfAnchorsNeedsAnEndorsement(t *testing.T) {
	oldRoot, newRoot := root(t, "old"), root(t, "new")
	b := bundle(t, 2, certs(newRoot), nil)
	b.Whole = true
	s := New(td, certs(newRoot, oldRoot), nil)
	if _, _, err := s.Accept(b); !errors.Is(err, ErrRejected) {
		t.Fatalf("an unendorsed whole bundle of one anchor: %v", err)
	}
	if s.Bootstrapped() {
		t.Fatal("the refused bundle bootstrapped the set")
	}
	b.Whole = false
	if _, _, err := s.Accept(b); err != nil {
		t.Fatalf("the same bundle, not whole: %v", err)
	}
	endorsed := bundle(t, 3, certs(newRoot), keys(newRoot))
	endorsed.Whole = true
	s = New(td, certs(newRoot, oldRoot), nil)
	if _, _, err := s.Accept(endorsed); err != nil {
		t.Fatalf("a whole bundle endorsed by an anchor: %v", err)
	}
	equalRoots(t, s, newRoot)
}
