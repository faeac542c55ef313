package ca

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// testKEK is the KEK the replicas of a test share, as a fleet shares -ca-kek-file.
var testKEK = mustKEK([]byte("0123456789abcdef0123456789abcdef"))

func mustKEK(b []byte) *KEK {
	k, err := NewKEK(b)
	if err != nil {
		panic(err)
	}
	return k
}

func selfSignedCfg() SelfSignedConfig {
	return SelfSignedConfig{TrustDomain: "cluster.local", KeyAlg: pki.ECP256, Bucket: "meshagent-ca", Replicas: 1,
		RootTTL: 10 * time.Minute, CheckInterval: time.Hour, GracePercent: 20, KEK: testKEK, MaxLeafTTL: 90 * 24 * time.Hour}
}

type replica struct {
	auth *Authority
	src  *SelfSigned
	rec  *recorder
}

func newReplica(t *testing.T, js jetstream.JetStream, fake *clock.Fake) *replica {
	r := &replica{auth: &Authority{}, rec: &recorder{}}
	r.src = NewSelfSigned(selfSignedCfg(), js, r.auth, r.rec.notify, hclog.NewNullLogger(), fake)
	return r
}

func (r *replica) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// eventuallyAnnounced waits until cond, moving fake past foreignAnnounceDelay
// whenever more than the idle timers (each running replica's next check) are
// armed: a replica waits to announce a change another replica wrote.
func eventuallyAnnounced(t *testing.T, fake *clock.Fake, idle int, what string, cond func() bool) {
	t.Helper()
	testkit.EventuallyWithin(t, 30*time.Second, what, func() bool {
		if fake.Timers() > idle {
			fake.Add(foreignAnnounceDelay)
		}
		return cond()
	})
}

func TestSelfSignedReplicasConvergeOnOneRoot(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	const n = 4
	reps := make([]*replica, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range reps {
		// Each replica has its own connection, as separate processes would.
		reps[i] = newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	}
	for i := range reps {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = reps[i].src.Start(context.Background()) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	want := reps[0].auth.Current().RootFingerprint()
	for i, r := range reps {
		if got := r.auth.Current().RootFingerprint(); got != want {
			t.Fatalf("replica %d root %s, replica 0 root %s", i, got, want)
		}
	}
	kv, err := bustest.JetStream(t, bustest.Conn(t, s)).KeyValue(context.Background(), "meshagent-ca")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), RootKey)
	if err != nil || e.Revision() != 1 {
		t.Fatalf("root entry revision %v, err %v: want exactly one write", e, err)
	}
}

// startTwo starts two replicas on s, each on its own connection as two processes
// would, sharing fake.
func startTwo(t *testing.T, s *server.Server, fake *clock.Fake) (a, b *replica) {
	t.Helper()
	a = newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	b = newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	for _, r := range []*replica{a, b} {
		if err := r.src.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

func TestSelfSignedRotationAcrossReplicas(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	a, b := startTwo(t, s, fake)
	ctx := context.Background()
	a.run(t)
	b.run(t)
	old := a.auth.Current()

	// Not due yet: nothing happens.
	fake.Add(7 * time.Minute) // 30% left
	if err := a.src.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if a.auth.Current() != old || len(a.rec.all()) != 0 {
		t.Fatal("rotated before the grace period")
	}
	// Due: 10% of the root's life left.
	fake.Add(2 * time.Minute)
	if err := a.src.Check(ctx); err != nil {
		t.Fatal(err)
	}
	cur := a.auth.Current()
	if cur == old || cur.Generation != old.Generation+1 || len(cur.Roots) != 2 || !cur.Roots[1].Equal(old.Roots[0]) {
		t.Fatalf("after rotation: gen %d, %d roots", cur.Generation, len(cur.Roots))
	}
	if !cur.Roots[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(old.Roots[0].PublicKey) {
		t.Fatal("rotation changed the key; the default keeps it, as Istio")
	}
	// Both replicas announce the new generation, the same event (JetStream keeps one
	// by its id): the writer from its own write, the other from the KV watch once
	// it has given the writer foreignAnnounceDelay to go first.
	for name, r := range map[string]*replica{"a": a, "b": b} {
		eventuallyAnnounced(t, fake, 2, "replica "+name+" announces gen 2", func() bool { return len(r.rec.all()) == 1 })
		tc := r.rec.all()[0]
		if tc.Reason != events.TrustReasonRotation || len(tc.Roots) != 2 || tc.Generation != cur.Generation ||
			len(tc.Added) != 1 || tc.Added[0] != cur.RootFingerprint() || len(tc.Removed) != 0 {
			t.Fatalf("replica %s trust.changed %+v", name, tc)
		}
		if r.src.Announced() != cur.Generation {
			t.Fatalf("replica %s announced %d, want %d", name, r.src.Announced(), cur.Generation)
		}
	}
	// The other replica follows through the KV watch and signs with the new root.
	testkit.EventuallyWithin(t, 30*time.Second, "replica b on the new root", func() bool {
		return b.auth.Current().RootFingerprint() == cur.RootFingerprint()
	})
	k, _ := pki.GenerateKey(pki.ECP256)
	id, _ := url.Parse("spiffe://cluster.local/ns/a/sa/b")
	leaf, err := b.auth.Current().SignLeaf(k.Public(), id, fake.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	newPool, oldPool := x509.NewCertPool(), x509.NewCertPool()
	newPool.AddCert(cur.Roots[0])
	oldPool.AddCert(old.Roots[0])
	for name, pool := range map[string]*x509.CertPool{"new": newPool, "old (same key)": oldPool} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: fake.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("leaf does not verify under the %s root: %v", name, err)
		}
	}
	// b's own check finds nothing to do: one rotation, not two.
	if err := b.src.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if b.auth.Current().Generation != cur.Generation {
		t.Fatal("second replica rotated again")
	}
	// The old root leaves the bundle when it expires.
	fake.Add(2 * time.Minute)
	if err := b.src.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.auth.Current(); len(got.Roots) != 1 || got.RootFingerprint() != cur.RootFingerprint() {
		t.Fatalf("expired root not dropped: %d roots", len(got.Roots))
	}
	for name, r := range map[string]*replica{"a": a, "b": b} {
		eventuallyAnnounced(t, fake, 2, "replica "+name+" announces the expiry", func() bool { return len(r.rec.all()) == 2 })
		if tc := r.rec.all()[1]; tc.Reason != events.TrustReasonExpired || len(tc.Removed) != 1 || tc.Generation != cur.Generation+1 {
			t.Fatalf("replica %s trust.changed on expiry %+v", name, tc)
		}
	}
	// A forced rotation with a new key.
	m, err := a.src.Rotate(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if m.Roots[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(cur.Roots[0].PublicKey) || len(m.Roots) != 2 {
		t.Fatal("forced rotation with new_key kept the key")
	}
}

func TestSelfSignedRSARoot(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	r := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	r.src.cfg.KeyAlg = pki.RSA2048
	if err := r.src.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := r.auth.Current()
	if alg, err := pki.AlgOf(m.Cert.PublicKey); err != nil || alg != pki.RSA2048 {
		t.Fatalf("root key %v %v", alg, err)
	}
	k, _ := pki.GenerateKey(pki.ECP256)
	id, _ := url.Parse("spiffe://cluster.local/ns/a/sa/b")
	leaf, err := m.SignLeaf(k.Public(), id, fake.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.CheckSignatureFrom(m.Cert); err != nil {
		t.Fatal(err)
	}
}

// TestRunKeepsTryingToWatchTheBucket: a replica whose CA bucket watch cannot be opened
// at once (its bus away here; in a CI run, a loaded cluster just after a node loss,
// slower than one API request) keeps trying instead of exiting — the fleet's only
// signer once exited that way — and then follows the root another replica writes.
func TestRunKeepsTryingToWatchTheBucket(t *testing.T) {
	dir := t.TempDir()
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	port := s.Addr().(*net.TCPAddr).Port
	fake := clock.NewFake(t0)
	a, b := startTwo(t, s, fake)
	ctx := context.Background()
	s.Shutdown()
	s.WaitForShutdown()
	// The control: with the bus away a watch really fails, which is what Run meets.
	if w, err := b.src.kv.Watch(ctx, RootKey); err == nil {
		_ = w.Stop()
		t.Fatal("a watch opened with the bus down: this test could not show the retry")
	}
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.src.Run(bctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	running := func() {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("Run returned while the bus was away: %v", err)
		default:
		}
	}
	// b waits between attempts (its only timer until a watch is open): let a few pass.
	for i := range 3 {
		testkit.EventuallyWithin(t, 30*time.Second, fmt.Sprintf("b waiting to try again (%d)", i), func() bool {
			running()
			return fake.Timers() > 0
		})
		fake.Add(2 * time.Second)
	}
	running()
	// The bus comes back where it was, with its state; both connections reconnect.
	s, err = embedded.Start(embedded.Config{Port: port, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	a.run(t)
	// b opens its watches (its next attempts) and follows a's rotation through them.
	old := b.auth.Current()
	rotated := false
	testkit.EventuallyWithin(t, 30*time.Second, "b on the root a rotated to", func() bool {
		running()
		if !rotated {
			if _, err := a.src.Rotate(ctx, true); err == nil {
				rotated = true
			}
		}
		fake.Add(time.Second) // b's retry waits, and the delay before it announces a's write
		cur := a.auth.Current()
		return rotated && cur != old && b.auth.Current().RootFingerprint() == cur.RootFingerprint()
	})
}
