package tlsrefresh

import (
	"crypto"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// rec records what the refresher asks of the dialer.
type rec struct {
	mu       sync.Mutex
	rebuilds []string
	gens     []uint64
}

func (r *rec) Rebuild(reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rebuilds = append(r.rebuilds, reason)
	return nil
}

func (r *rec) TrustChanged(gen uint64, roots []*x509.Certificate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gens = append(r.gens, gen)
	return nil
}

func (r *rec) snapshot() ([]string, []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.rebuilds...), append([]uint64(nil), r.gens...)
}

// changes is an sds-edge side that fires on demand, like sdsclient.Watcher.Changed.
type changes struct {
	mu sync.Mutex
	ch chan struct{}
}

func (c *changes) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

func (c *changes) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.ch)
	c.ch = make(chan struct{})
}

// trusted is sds-edge's ROOTCA.
type trusted struct{ roots []*x509.Certificate }

func (t trusted) RootsPEM() ([]byte, error) { return pki.EncodeCertsPEM(t.roots), nil }

// trustChanged is a trust.changed of roots at gen, endorsed by keys.
func trustChanged(t *testing.T, gen uint64, roots []*x509.Certificate, keys ...crypto.Signer) *nats.Msg {
	t.Helper()
	ev := events.TrustChanged{TrustDomain: "td", Roots: pki.CertPEMs(roots), Reason: "x", Generation: gen}
	var err error
	if ev.Endorsements, err = trustbundle.Endorse(ev.TrustDomain, gen, ev.Roots, keys...); err != nil {
		t.Fatal(err)
	}
	msg, err := events.NewMsg(events.SubjectTrustChanged, "signer", ev)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// A bus client without a CA key cannot make the relay trust a root: trust.changed
// reaches the dialer only when an endorsement verifies under a root the pod trusts
// (sds-edge's ROOTCA, then the last bundle taken), as sds-edge checks it.
func TestRefresherTakesOnlyEndorsedBundles(t *testing.T) {
	nc := bustest.Conn(t, bustest.Server(t))
	r := &rec{}
	old := testkit.NewCA(t, "old root", nil, time.Now(), time.Hour)
	rogue := testkit.NewCA(t, "rogue root", nil, time.Now(), time.Hour)
	next := testkit.NewCA(t, "next root", nil, time.Now(), time.Hour)
	stranger := testkit.NewCA(t, "stranger", nil, time.Now(), time.Hour)
	testkit.Background(t, New(nc, r, nil, trusted{[]*x509.Certificate{old.Cert}}, hclog.NewNullLogger()).Run)
	attacks := []*nats.Msg{
		trustChanged(t, 2, []*x509.Certificate{rogue.Cert}),                         // not endorsed
		trustChanged(t, 3, []*x509.Certificate{rogue.Cert}, rogue.Key),              // endorsed by itself
		trustChanged(t, 4, []*x509.Certificate{rogue.Cert, old.Cert}, stranger.Key), // by a key nobody trusts
	}
	// The positive control last: the same subscription, in order, so every attack
	// was handled before it.
	testkit.Eventually(t, "an endorsed bundle reaches the dialer", func() bool {
		for _, m := range attacks {
			_ = nc.PublishMsg(m)
		}
		_ = nc.PublishMsg(trustChanged(t, 5, []*x509.Certificate{next.Cert, old.Cert}, old.Key))
		_ = nc.Flush()
		_, gens := r.snapshot()
		return len(gens) > 0
	})
	_, gens := r.snapshot()
	for _, g := range gens {
		if g != 5 {
			t.Fatalf("dialer got generation %d: an unendorsed bundle got through", g)
		}
	}
	// The root taken endorses the next bundle, as in a rotation after the old root
	// left sds-edge's ROOTCA.
	_ = nc.PublishMsg(trustChanged(t, 6, []*x509.Certificate{next.Cert}, next.Key))
	testkit.Eventually(t, "a bundle endorsed by the root taken", func() bool {
		_, gens := r.snapshot()
		return gens[len(gens)-1] == 6
	})
}

func TestRefresherRebuildsOnEveryChange(t *testing.T) {
	nc := bustest.Conn(t, bustest.Server(t))
	r := &rec{}
	c := &changes{ch: make(chan struct{})}
	root := testkit.NewCA(t, "root", nil, time.Now(), time.Hour)
	testkit.Background(t, New(nc, r, c, trusted{[]*x509.Certificate{root.Cert}}, hclog.NewNullLogger()).Run)
	// Bad events first: garbled, and a bundle that is not PEM. Neither reaches the dialer.
	testkit.Eventually(t, "subscription", func() bool {
		_ = nc.Publish(events.SubjectTrustChanged, []byte("garbage"))
		msg, _ := events.NewMsg(events.SubjectTrustChanged, "signer", events.TrustChanged{TrustDomain: "td",
			Roots: []string{"-----BEGIN CERTIFICATE-----\nAA\n-----END CERTIFICATE-----\n"}, Reason: "x", Generation: 1})
		_ = nc.PublishMsg(msg)
		_ = nc.PublishMsg(trustChanged(t, 7, []*x509.Certificate{root.Cert}, root.Key))
		_ = nc.Flush()
		_, gens := r.snapshot()
		return len(gens) > 0
	})
	_, gens := r.snapshot()
	for _, g := range gens {
		if g != 7 {
			t.Fatalf("dialer got generation %d: a bad event got through", g)
		}
	}
	c.fire()
	testkit.Eventually(t, "rebuild on sds-edge change", func() bool { rb, _ := r.snapshot(); return len(rb) == 1 })
	c.fire()
	testkit.Eventually(t, "second rebuild", func() bool { rb, _ := r.snapshot(); return len(rb) == 2 })
}
