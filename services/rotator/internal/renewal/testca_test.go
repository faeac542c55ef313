package renewal

import (
	"crypto"
	"crypto/x509"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/tests/testkit"
)

const testTD = "cluster.local"

// testCA stands in for the signer: named roots (testkit.NewCA), newest
// first, a bundle that grows by a generation with every root and is endorsed by
// every root's key (the keys a consumer already trusts among them), answers to
// bundle requests, and cert.issued records with the real chain of a real leaf.
type testCA struct {
	t     testing.TB
	mu    sync.Mutex
	names map[string]int // index in roots
	roots []*testkit.CA
	gen   uint64
}

func newTestCA(t testing.TB) *testCA { return &testCA{t: t, names: map[string]int{}} }

// root returns the root named name, making it (the newest) if it is new; it
// returns its PEM and fingerprint.
func (c *testCA) root(name string) (string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.names[name]; ok {
		return c.roots[i].PEM(), pki.Fingerprint(c.roots[i].Cert)
	}
	// Valid from 30 days back for a year: leaves are backdated and the clock moves.
	ca := testkit.NewCA(c.t, name, nil, time.Now().Add(-30*24*time.Hour), 365*24*time.Hour)
	c.roots = append([]*testkit.CA{ca}, c.roots...)
	for n, i := range c.names {
		c.names[n] = i + 1
	}
	c.names[name] = 0
	c.gen++
	return ca.PEM(), pki.Fingerprint(ca.Cert)
}

// keysLocked are the keys of every root, newest first; c.mu is held.
func (c *testCA) keysLocked() []crypto.Signer {
	var out []crypto.Signer
	for _, r := range c.roots {
		out = append(out, r.Key)
	}
	return out
}

// bundle returns the whole bundle, its generation and its endorsements.
func (c *testCA) bundle(t testing.TB) ([]string, uint64, []events.Endorsement) {
	c.mu.Lock()
	var roots []string
	for _, r := range c.roots {
		roots = append(roots, r.PEM())
	}
	gen, keys := c.gen, c.keysLocked()
	c.mu.Unlock()
	return roots, gen, endorse(t, gen, roots, keys)
}

// trustChanged is an endorsed trust.changed naming the given roots at gen.
func (c *testCA) trustChanged(t testing.TB, gen uint64, names ...string) events.TrustChanged {
	var roots []string
	for _, n := range names {
		p, _ := c.root(n)
		roots = append(roots, p)
	}
	c.mu.Lock()
	keys := c.keysLocked()
	c.mu.Unlock()
	return events.TrustChanged{TrustDomain: testTD, Roots: roots, Reason: events.TrustReasonRotation, Generation: gen,
		Endorsements: endorse(t, gen, roots, keys)}
}

// endorse is the signer's endorsement of the bundle (testTD, gen, roots) by keys.
func endorse(t testing.TB, gen uint64, roots []string, keys []crypto.Signer) []events.Endorsement {
	ends, err := trustbundle.Endorse(testTD, gen, roots, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return ends
}

// serveBundle answers trust bundle requests on nc until the test ends.
func (c *testCA) serveBundle(t *testing.T, nc *nats.Conn) *nats.Subscription {
	sub, err := nc.Subscribe(events.SubjectTrustBundle, func(m *nats.Msg) {
		roots, gen, ends := c.bundle(t)
		out, _ := events.NewMsg(m.Reply, "test-ca", events.BundleReply{TrustDomain: testTD, Roots: roots, Generation: gen, Endorsements: ends})
		_ = m.RespondMsg(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

// leafSpec is a leaf for spiffeID with serial (hex), valid from nb for life.
func leafSpec(t testing.TB, spiffeID, serial string, nb time.Time, life time.Duration) testkit.Spec {
	n, ok := new(big.Int).SetString(serial, 16)
	if !ok {
		t.Fatalf("serial %q is not hex", serial)
	}
	return testkit.Spec{ID: spiffeID, Serial: n, NotBefore: nb, Life: life}
}

// leaf issues a leaf for spiffeID with serial (hex), valid from nb for life, under
// the root named root (made if new).
func (c *testCA) leaf(t testing.TB, spiffeID, serial string, nb time.Time, life time.Duration, root string) *x509.Certificate {
	c.root(root)
	c.mu.Lock()
	ca := c.roots[c.names[root]]
	c.mu.Unlock()
	return ca.Issue(t, leafSpec(t, spiffeID, serial, nb, life)).Cert
}

// record is the genuine cert.issued of a new leaf.
func (c *testCA) record(t testing.TB, pod, serial string, nb time.Time, life time.Duration, root string) events.CertIssued {
	id := "spiffe://cluster.local/ns/default/sa/" + pod
	leaf := c.leaf(t, id, serial, nb, life, root)
	_, fp := c.root(root)
	return events.CertIssued{Serial: serial, SPIFFEID: id, NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, Pod: dpod(pod),
		Resource: "default", KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: fp,
		CertChain: pki.CertPEMs([]*x509.Certificate{leaf})}
}

// adopt makes ca the newest root, named name (a root made elsewhere: a rotation's).
func (c *testCA) adopt(name string, ca *testkit.CA) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roots = append([]*testkit.CA{ca}, c.roots...)
	for n, i := range c.names {
		c.names[n] = i + 1
	}
	c.names[name] = 0
	c.gen++
}
