package tlsrefresh

import (
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
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

func TestRefresherRebuildsOnEveryChange(t *testing.T) {
	nc := bustest.Conn(t, bustest.Server(t))
	r := &rec{}
	c := &changes{ch: make(chan struct{})}
	testkit.Background(t, New(nc, r, c, hclog.NewNullLogger()).Run)
	// Bad events first: garbled, and a bundle that is not PEM. Neither reaches the dialer.
	testkit.Eventually(t, "subscription", func() bool {
		_ = nc.Publish(events.SubjectTrustChanged, []byte("garbage"))
		msg, _ := events.NewMsg(events.SubjectTrustChanged, "signer", events.TrustChanged{TrustDomain: "td",
			Roots: []string{"-----BEGIN CERTIFICATE-----\nAA\n-----END CERTIFICATE-----\n"}, Reason: "x", Generation: 1})
		_ = nc.PublishMsg(msg)
		good, _ := events.NewMsg(events.SubjectTrustChanged, "signer", events.TrustChanged{TrustDomain: "td",
			Roots: []string{testkit.NewCA(t, "root", nil, time.Now(), time.Hour).PEM()}, Reason: "x", Generation: 7})
		_ = nc.PublishMsg(good)
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
