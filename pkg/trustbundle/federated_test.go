package trustbundle

import (
	"errors"
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestForeignTakesOnlyHomeEndorsedBundles(t *testing.T) {
	home, west, mallory := root(t, "home"), root(t, "west"), root(t, "mallory")
	s := New(td, certs(home), nil)
	u, err := s.Check(bundle(t, 1, certs(home), keys(home)))
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(u)
	f := NewForeign(s)

	ev := func(foreign string, version uint64, by *testkit.CA, removed bool) events.TrustFederated {
		e := events.TrustFederated{TrustDomain: td, Foreign: foreign, Version: version, Removed: removed, Source: "https://west/b"}
		if !removed {
			e.Roots = pki.CertPEMs(certs(west))
		}
		var err error
		if e.Endorsements, err = EndorseFederated(td, foreign, version, e.Roots, by.Key); err != nil {
			t.Fatal(err)
		}
		return e
	}
	// Endorsed by someone without the home CA key: refused, nothing changes.
	if _, err := f.Apply(ev("west.example", 1, mallory, false)); !errors.Is(err, ErrRejected) {
		t.Fatalf("mallory's endorsement: err = %v", err)
	}
	if len(f.Domains()) != 0 {
		t.Fatal("a refused event added a domain")
	}
	// An endorsement for one foreign domain does not pass as another's.
	replay := ev("west.example", 1, home, false)
	replay.Foreign = "north.example"
	if _, err := f.Apply(replay); !errors.Is(err, ErrRejected) {
		t.Fatalf("replayed endorsement: err = %v", err)
	}
	if ok, err := f.Apply(ev("west.example", 2, home, false)); !ok || err != nil {
		t.Fatalf("home-endorsed: %v %v", ok, err)
	}
	if r := f.Roots("west.example"); len(r) != 1 || !r[0].Equal(west.Cert) {
		t.Fatalf("west roots = %v", r)
	}
	if f.Roots(td) != nil || f.Roots("north.example") != nil {
		t.Fatal("roots leaked into another domain")
	}
	// Older news is dropped; a newer removal removes.
	if ok, _ := f.Apply(ev("west.example", 1, home, true)); ok || len(f.Roots("west.example")) != 1 {
		t.Fatal("a stale removal was applied")
	}
	if ok, err := f.Apply(ev("west.example", 3, home, true)); !ok || err != nil || f.Roots("west.example") != nil {
		t.Fatalf("removal: %v %v", ok, err)
	}
}
