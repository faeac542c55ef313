package ca

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// endorsed reports whether a pod trusting only trusted accepts m's bundle.
func endorsed(trusted []*x509.Certificate, m *Material) error {
	return signertest.VerifyEndorsed(trusted, "cluster.local", m.Generation, m.RootPEMs(), m.Endorsements())
}

// A pod that trusts only the first root follows the bundle through a same-key and a
// new-key rotation; an endorsement by a stranger's key, or one for another bundle,
// does not verify.
func TestEndorsementsLetAnOldRootFollow(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	r := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	first := r.auth.Current()
	oldOnly := first.Roots[:1]
	if err := endorsed(oldOnly, first); err != nil {
		t.Fatalf("first bundle: %v", err)
	}
	sameKey, err := r.src.Rotate(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(sameKey.Endorsements()) != 1 {
		t.Fatalf("same-key rotation: %d endorsements, want 1 (one key)", len(sameKey.Endorsements()))
	}
	if err := endorsed(oldOnly, sameKey); err != nil {
		t.Fatalf("after a same-key rotation: %v", err)
	}
	newKey, err := r.src.Rotate(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(newKey.Endorsements()) != 2 {
		t.Fatalf("new-key rotation: %d endorsements, want 2 (new key, previous key)", len(newKey.Endorsements()))
	}
	for name, trusted := range map[string][]*x509.Certificate{"first root": oldOnly, "second root": sameKey.Roots[:1], "new root": newKey.Roots[:1]} {
		if err := endorsed(trusted, newKey); err != nil {
			t.Errorf("a pod trusting only the %s: %v", name, err)
		}
	}
	// What the replica announced carries the same endorsements. (The same-key
	// generation may not be among it: a newer generation supersedes one not yet
	// published.)
	testkit.EventuallyWithin(t, 30*time.Second, "trust.changed for the new-key rotation", func() bool {
		all := r.rec.all()
		return len(all) > 0 && all[len(all)-1].Generation == newKey.Generation
	})
	for _, tc := range r.rec.all() {
		if err := signertest.VerifyEndorsed(oldOnly, tc.TrustDomain, tc.Generation, tc.Roots, tc.Endorsements); err != nil {
			t.Errorf("trust.changed gen %d: %v", tc.Generation, err)
		}
	}

	stranger := testkit.NewCA(t, "meshagent root CA", nil, t0, time.Hour)
	msg, _ := events.EndorsedBytes("cluster.local", newKey.Generation, newKey.RootPEMs())
	id, sig, err := pki.Endorse(stranger.Key, msg)
	if err != nil {
		t.Fatal(err)
	}
	forged := []events.Endorsement{{KeyID: id, Signature: sig}, {KeyID: id, Signature: sig, Chain: []string{string(pki.EncodeCertPEM(stranger.Cert))}}}
	if err := signertest.VerifyEndorsed(oldOnly, "cluster.local", newKey.Generation, newKey.RootPEMs(), forged); !errors.Is(err, pki.ErrNotEndorsed) {
		t.Fatalf("a stranger's endorsement verified: %v", err)
	}
	// A genuine endorsement does not carry over to another bundle or generation.
	attacker := append([]string{string(pki.EncodeCertPEM(stranger.Cert))}, newKey.RootPEMs()...)
	if err := signertest.VerifyEndorsed(oldOnly, "cluster.local", newKey.Generation, attacker, newKey.Endorsements()); !errors.Is(err, pki.ErrNotEndorsed) {
		t.Fatalf("endorsement verified for a bundle with an added root: %v", err)
	}
	if err := signertest.VerifyEndorsed(oldOnly, "cluster.local", newKey.Generation+1, newKey.RootPEMs(), newKey.Endorsements()); !errors.Is(err, pki.ErrNotEndorsed) {
		t.Fatalf("endorsement verified for another generation: %v", err)
	}
}

// Plugged-in: the intermediate endorses, with its chain, so a pod trusting the
// offline root accepts it.
func TestPluggedEndorsesWithTheIntermediate(t *testing.T) {
	now := time.Now() // a pod checks the endorsing chain at the real time
	root := testkit.NewCA(t, "root", nil, now, 24*time.Hour)
	inter := testkit.NewCA(t, "inter", root, now, 12*time.Hour)
	dir := t.TempDir()
	signertest.WriteCACerts(t, dir, inter, []*x509.Certificate{root.Cert}, root.Cert)
	auth := &Authority{}
	p := NewPlugged(dir, time.Millisecond, "cluster.local", auth, nil, hclog.NewNullLogger(), clock.NewFake(now))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := auth.Current()
	if e := m.Endorsements(); len(e) != 1 || len(e[0].Chain) != 1 {
		t.Fatalf("endorsements %+v, want one with the intermediate as chain", e)
	}
	if err := endorsed([]*x509.Certificate{root.Cert}, m); err != nil {
		t.Fatal(err)
	}
	if got := m.IntermediatePEMs(); len(got) != 1 || got[0] != string(pki.EncodeCertPEM(inter.Cert)) {
		t.Fatalf("intermediates %d", len(got))
	}
}

// Refused rotations change nothing: no KV write, no trust.changed, same material.
func TestRotationLimits(t *testing.T) {
	tests := []struct {
		name     string
		interval time.Duration
		before   int  // successful rotations first, one minute apart
		newKey   bool // those rotations make a new key
		want     error
	}{
		{"too soon after the last rotation", time.Minute, 1, true, ErrRotateTooSoon},
		{"bundle full", time.Minute, MaxRoots - 1, false, ErrBundleFull},
		{"a rotation to a new key still in its phases", 0, 1, true, ErrRotateTooSoon},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := bustest.Server(t)
			fake := clock.NewFake(t0)
			js := bustest.JetStream(t, bustest.Conn(t, s))
			r := newReplica(t, js, fake)
			r.src.cfg.RootTTL = 100 * 24 * time.Hour
			r.src.cfg.RotateMinInterval = tt.interval
			ctx := context.Background()
			if err := r.src.Start(ctx); err != nil {
				t.Fatal(err)
			}
			for i := range tt.before {
				fake.Add(time.Minute)
				if _, err := r.src.Rotate(ctx, tt.newKey); err != nil {
					t.Fatalf("rotation %d: %v", i, err)
				}
			}
			if tt.want == ErrBundleFull {
				fake.Add(time.Minute) // not too soon: only the cap refuses
			}
			cur, kv, announced := r.auth.Current(), kvValue(t, js), len(r.rec.all())
			_, err := r.src.Rotate(ctx, true)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if after := kvValue(t, js); after.Revision() != kv.Revision() || !bytes.Equal(after.Value(), kv.Value()) {
				t.Fatal("kv changed")
			}
			if r.auth.Current() != cur || len(r.rec.all()) != announced {
				t.Fatal("material changed or trust.changed queued")
			}
		})
	}
}

// TestFirstRotationNeedsNoWait: the first root is no rotation, so an operator may
// rotate right after start; the second rotation waits.
func TestFirstRotationNeedsNoWait(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	r := newReplica(t, js, fake)
	r.src.cfg.RotateMinInterval = time.Hour
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.src.Rotate(ctx, false); err != nil {
		t.Fatalf("first rotation: %v", err)
	}
	fake.Add(time.Minute)
	if _, err := r.src.Rotate(ctx, false); !errors.Is(err, ErrRotateTooSoon) {
		t.Fatalf("second rotation a minute later: %v", err)
	}
}
