package renewal

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

const testTD = "cluster.local"

// testCA stands in for the signer: named roots, newest first, a bundle that
// grows by a generation with every root and is endorsed by every root's key (the
// keys a consumer already trusts among them), answers to bundle requests, and
// cert.issued records with the real chain of a real leaf.
type testCA struct {
	mu    sync.Mutex
	names map[string]int // index in roots
	roots []*x509.Certificate
	keys  []crypto.Signer
	gen   uint64
}

func newTestCA(t *testing.T) *testCA { return &testCA{names: map[string]int{}} }

func genKey(t testing.TB) crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// root returns the root named name, making it (the newest) if it is new; it
// returns its PEM and fingerprint.
func (c *testCA) root(name string) (string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.names[name]; ok {
		return pki.CertPEMs(c.roots[i : i+1])[0], pki.Fingerprint(c.roots[i])
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(len(c.roots) + 1)), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-30 * 24 * time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		panic(err)
	}
	cert, _ := x509.ParseCertificate(der)
	c.roots = append([]*x509.Certificate{cert}, c.roots...)
	c.keys = append([]crypto.Signer{k}, c.keys...)
	for n, i := range c.names {
		c.names[n] = i + 1
	}
	c.names[name] = 0
	c.gen++
	return pki.CertPEMs([]*x509.Certificate{cert})[0], pki.Fingerprint(cert)
}

// bundle returns the whole bundle, its generation and its endorsements.
func (c *testCA) bundle(t testing.TB) ([]string, uint64, []events.Endorsement) {
	c.mu.Lock()
	roots, gen, keys := pki.CertPEMs(c.roots), c.gen, append([]crypto.Signer(nil), c.keys...)
	c.mu.Unlock()
	return roots, gen, endorse(t, gen, roots, keys...)
}

// endorse signs the bundle (gen, roots) with each key.
func endorse(t testing.TB, gen uint64, roots []string, keys ...crypto.Signer) []events.Endorsement {
	msg, err := events.EndorsedBytes(testTD, gen, roots)
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Endorsement
	for _, k := range keys {
		id, sig, err := pki.Endorse(k, msg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, events.Endorsement{KeyID: id, Signature: sig})
	}
	return out
}

// trustChanged is an endorsed trust.changed naming the given roots at gen.
func (c *testCA) trustChanged(t testing.TB, gen uint64, names ...string) events.TrustChanged {
	var roots []string
	for _, n := range names {
		p, _ := c.root(n)
		roots = append(roots, p)
	}
	c.mu.Lock()
	keys := append([]crypto.Signer(nil), c.keys...)
	c.mu.Unlock()
	return events.TrustChanged{TrustDomain: testTD, Roots: roots, Reason: events.TrustReasonRotation, Generation: gen,
		Endorsements: endorse(t, gen, roots, keys...)}
}

// serveBundle answers trust bundle requests on nc until the test ends.
func (c *testCA) serveBundle(t *testing.T, nc *nats.Conn) {
	sub, err := nc.Subscribe(events.SubjectTrustBundle, func(m *nats.Msg) {
		roots, gen, ends := c.bundle(t)
		out, _ := events.NewMsg(m.Reply, "test-ca", events.BundleReply{TrustDomain: testTD, Roots: roots, Generation: gen, Endorsements: ends})
		_ = m.RespondMsg(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// leaf issues a leaf for spiffeID with serial (hex), valid from nb for life, under
// the root named root (made if new), signed by signer instead when it is not nil.
func (c *testCA) leaf(t testing.TB, spiffeID, serial string, nb time.Time, life time.Duration, root string) *x509.Certificate {
	c.root(root)
	c.mu.Lock()
	i := c.names[root]
	parent, key := c.roots[i], c.keys[i]
	c.mu.Unlock()
	return mintLeaf(t, spiffeID, serial, nb, life, parent, key)
}

func mintLeaf(t testing.TB, spiffeID, serial string, nb time.Time, life time.Duration, parent *x509.Certificate, key crypto.Signer) *x509.Certificate {
	n, ok := new(big.Int).SetString(serial, 16)
	if !ok {
		t.Fatalf("serial %q is not hex", serial)
	}
	u, err := url.Parse(spiffeID)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: n, URIs: []*url.URL{u}, NotBefore: nb, NotAfter: nb.Add(life),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	lk := genKey(t)
	signer := parent
	if signer == nil { // self-signed
		signer, key = tmpl, lk
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, lk.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// record is the genuine cert.issued of a new leaf.
func (c *testCA) record(t testing.TB, pod, serial string, nb time.Time, life time.Duration, root string) events.CertIssued {
	id := "spiffe://cluster.local/ns/default/sa/" + pod
	leaf := c.leaf(t, id, serial, nb, life, root)
	_, fp := c.root(root)
	return events.CertIssued{Serial: serial, SPIFFEID: id, NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, Pod: pod,
		Resource: "default", KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: fp,
		CertChain: pki.CertPEMs([]*x509.Certificate{leaf})}
}
