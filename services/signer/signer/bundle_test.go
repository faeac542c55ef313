package signer

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// signOK signs a CSR over NATS (compact, the sign subjects' one encoding) and fails
// the test on an error reply; the same request as a CloudEvent is refused with a
// typed code and signs nothing.
func signOK(t *testing.T, e *env) events.SignReply {
	t.Helper()
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	req := events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), TTL: time.Minute}
	msg, err := events.NewMsg(events.SubjectSignAny, "test", req)
	if err != nil {
		t.Fatal(err)
	}
	if rep := natsRaw(t, e.nc, msg); rep.Error == nil || rep.Error.Code != events.CodeInvalidArgument || len(rep.CertChain) != 0 {
		t.Fatalf("a CloudEvent on a sign subject: %+v", rep)
	}
	rep := natsSignIn(t, e.nc, events.EncodingCompact, "", req)
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	verifyChain(t, rep.CertChain, rep.Roots, e.clock.Now())
	return rep
}

// Bundle replies, sign replies and trust.changed are endorsed, so that a pod that
// trusts only the first root follows a rotation to a new key; cert.issued carries the
// chain without the root.
func TestRepliesAndEventsAreEndorsed(t *testing.T) {
	e := newEnv(t)
	c := e.config("signer-a")
	c.CA.RotateMinInterval = 0
	e.start(t, c)
	first := bundle(t, e.nc)
	oldOnly := mustCerts(t, first.Roots[:1])
	if err := signertest.VerifyEndorsed(oldOnly, first.TrustDomain, first.Generation, first.Roots, first.Endorsements); err != nil {
		t.Fatalf("bundle reply: %v", err)
	}
	rep := signOK(t, e)
	if rep.TrustDomain != "cluster.local" || rep.Generation != first.Generation {
		t.Fatalf("sign reply trust domain %q generation %d", rep.TrustDomain, rep.Generation)
	}
	if err := signertest.VerifyEndorsed(oldOnly, rep.TrustDomain, rep.Generation, rep.Roots, rep.Endorsements); err != nil {
		t.Fatalf("sign reply: %v", err)
	}
	ci := last[events.CertIssued](t, e.js, events.SubjectCertIssued)
	if len(ci.CertChain) != 1 || ci.CertChain[0] != rep.CertChain[0] {
		t.Fatalf("cert.issued chain of %d, want the leaf alone (self-signed: no intermediates, root excluded)", len(ci.CertChain))
	}

	for i, newKey := range []bool{false, true} {
		rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: newKey})
		if rr.Error != nil {
			t.Fatal(rr.Error)
		}
		testkit.EventuallyWithin(t, 10*time.Second, "trust.changed", func() bool { return count(t, e.js, events.SubjectTrustChanged) == uint64(i+1) })
		tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged)
		if err := signertest.VerifyEndorsed(oldOnly, tc.TrustDomain, tc.Generation, tc.Roots, tc.Endorsements); err != nil {
			t.Fatalf("trust.changed after rotation (new key %v): %v", newKey, err)
		}
		rep := signOK(t, e)
		if rep.Generation != tc.Generation {
			t.Fatalf("sign reply generation %d, trust.changed %d", rep.Generation, tc.Generation)
		}
		if err := signertest.VerifyEndorsed(oldOnly, rep.TrustDomain, rep.Generation, rep.Roots, rep.Endorsements); err != nil {
			t.Fatalf("sign reply after rotation (new key %v): %v", newKey, err)
		}
		if b := bundle(t, e.nc); signertest.VerifyEndorsed(oldOnly, b.TrustDomain, b.Generation, b.Roots, b.Endorsements) != nil {
			t.Fatalf("bundle reply after rotation (new key %v) not endorsed", newKey)
		}
	}
}

func TestPluggedCertIssuedCarriesTheIntermediate(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	root, inter, dir := pluggedCADir(t, now)
	c := e.config("signer-p")
	c.CA.Dir, c.CA.KEKFile = dir, ""
	e.start(t, c)
	rep := signOK(t, e)
	ci := last[events.CertIssued](t, e.js, events.SubjectCertIssued)
	chain := mustCerts(t, ci.CertChain)
	if len(chain) != 2 || !chain[1].Equal(inter.Cert) || ci.CertChain[0] != rep.CertChain[0] {
		t.Fatalf("cert.issued chain of %d, want leaf and intermediate", len(chain))
	}
	verifyChain(t, append(ci.CertChain, rep.CertChain[2]), rep.Roots, now)
	if err := signertest.VerifyEndorsed([]*x509.Certificate{root.Cert}, rep.TrustDomain, rep.Generation, rep.Roots, rep.Endorsements); err != nil {
		t.Fatalf("plugged-in sign reply: %v", err)
	}
}

// Rotation after rotation (the attack that once grew the bundle past 64 KiB and
// stopped signing): old roots leave once no leaf they signed can be valid, so the
// bundle stays bounded, every rotation is announced and signing keeps working.
func TestManyRotationsKeepTheBundleBounded(t *testing.T) {
	e := newEnv(t)
	fake := clock.NewFake(time.Now())
	e.clock = fake
	c := e.config("signer-a")
	c.Certs.DefaultTTL, c.Certs.MaxTTL = 10*time.Minute, time.Hour
	c.CA.RootTTL = 1000 * time.Hour
	c.CA.CheckInterval = 20 * time.Millisecond
	c.CA.RotateMinInterval = time.Second
	e.start(t, c)
	var published uint64
	for i := range 30 {
		fake.Add(10 * time.Minute)
		if i%3 == 0 && i > 0 {
			// A new-key rotation's phases end 2×(max TTL + slack) after it: the next waits.
			fake.Add(2 * (time.Hour + ca.RetireSlack))
		}
		rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: i%3 == 2})
		if rr.Error != nil {
			t.Fatalf("rotation %d: %v", i, rr.Error)
		}
		if len(rr.Roots) > ca.MaxRoots {
			t.Fatalf("rotation %d: %d roots", i, len(rr.Roots))
		}
		testkit.EventuallyWithin(t, 10*time.Second, "trust.changed for the rotation", func() bool { return count(t, e.js, events.SubjectTrustChanged) > published })
		published = count(t, e.js, events.SubjectTrustChanged)
		rep := signOK(t, e)
		verifyChain(t, rep.CertChain, rep.Roots, fake.Now())
	}
	b := bundle(t, e.nc)
	// MaxTTL 1h + slack at one rotation per 10 minutes: the current root and the 7 before it.
	if len(b.Roots) > ca.MaxRoots || len(b.Roots) < 2 {
		t.Fatalf("bundle of %d roots after 30 rotations", len(b.Roots))
	}
	tc := last[events.TrustChanged](t, e.js, events.SubjectTrustChanged)
	msg, err := events.Encode(events.SubjectTrustChanged, events.Meta{Source: "test"}, tc)
	if err != nil || len(msg.Data) > events.MaxEventSize/4 {
		t.Fatalf("trust.changed of %d bytes (err %v)", len(msg.Data), err)
	}
}

// writeKEK writes data to a KEK file with mode.
func writeKEK(t *testing.T, data []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca-kek")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// startErr builds and runs a signer that must fail to start, and returns why.
func startErr(t *testing.T, e *env, cfg config.Config) error {
	t.Helper()
	http := obs.NewServer(cfg.Listen.HTTP, hclog.NewNullLogger())
	s, err := New(cfg, lifecycle.Deps{Bus: bustest.Conn(t, e.srv), Clock: e.clock, Metrics: http.Registry(), Health: http})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = s.Run(ctx)
	if err == nil {
		t.Fatal("signer started")
	}
	return err
}

// Bad CA input gets a clear error and changes nothing: no KV write, no trust.changed.
func TestBadCAInputChangesNothing(t *testing.T) {
	e := newEnv(t)
	fake := clock.NewFake(time.Now())
	e.clock = fake
	c := e.config("signer-a")
	c.CA.RootTTL = 1000 * time.Hour
	s := e.start(t, c)
	// Same-key rotations before: a new-key one holds the next until its phases end.
	rotateWith := func(newKey bool) error {
		if err := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: newKey}).Error; err != nil {
			return err
		}
		return nil
	}
	// prepared rotates with the same key and waits until the rotation is announced:
	// the announcer publishes only the newest generation it has not published yet,
	// so rotations faster than their announcements (a loaded machine) would leave
	// fewer trust.changed than generations, and the count below would never match.
	prepared := func() {
		t.Helper()
		if err := rotateWith(false); err != nil {
			t.Fatal(err)
		}
		testkit.EventuallyWithin(t, 30*time.Second, "rotation announced", func() bool {
			return s.source.Announced() == s.auth.Current().Generation
		})
	}
	rotate := func() error { return rotateWith(true) }
	withKEK := func(path string) error {
		bad := e.config("signer-b")
		bad.CA.KEKFile = path
		return startErr(t, e, bad)
	}
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i + 1)
	}
	tests := []struct {
		name    string
		prepare func()
		act     func() error
		want    string
	}{
		{name: "KEK file readable by others", act: func() error { return withKEK(writeKEK(t, key, 0o644)) }, want: "others may access it"},
		{name: "KEK file of 16 bytes", act: func() error { return withKEK(writeKEK(t, key[:16], 0o600)) }, want: "want 32 random bytes"},
		{name: "no KEK file", act: func() error { return withKEK(filepath.Join(t.TempDir(), "nope")) }, want: "-ca-kek-file"},
		{name: "wrong KEK", act: func() error { return withKEK(writeKEK(t, key, 0o600)) }, want: "cannot unseal CA key: wrong -ca-kek-file?"},
		{
			name:    "rotation too soon",
			prepare: prepared, // the first rotation needs no wait
			act:     rotate,
			want:    events.CodeResourceExhausted + ": root rotation refused: too soon",
		},
		{
			name: "bundle full",
			prepare: func() {
				for range ca.MaxRoots - 2 { // one rotation done above
					fake.Add(time.Minute)
					prepared()
				}
				fake.Add(time.Minute)
			},
			act:  rotate,
			want: events.CodeResourceExhausted + ": root rotation refused: the trust bundle is full",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.prepare != nil {
				tt.prepare()
			}
			testkit.EventuallyWithin(t, 30*time.Second, "earlier changes announced", func() bool {
				return s.source.Announced() == s.auth.Current().Generation &&
					count(t, e.js, events.SubjectTrustChanged) == s.auth.Current().Generation-1
			})
			rev, announced, gen := rootRevision(t, e.js), count(t, e.js, events.SubjectTrustChanged), s.auth.Current().Generation
			err := tt.act()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if got := rootRevision(t, e.js); got != rev {
				t.Fatalf("kv revision %d -> %d", rev, got)
			}
			if got := s.auth.Current().Generation; got != gen {
				t.Fatalf("generation %d -> %d", gen, got)
			}
			if got := count(t, e.js, events.SubjectTrustChanged); got != announced {
				t.Fatalf("trust.changed %d -> %d", announced, got)
			}
			signOK(t, e) // and signing goes on
		})
	}
}
