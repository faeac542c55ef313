package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// domain is one trust domain of a test: its root, its bundle endpoint and a
// follower of the other domains.
type domain struct {
	td       spiffeid.TrustDomain
	mu       sync.Mutex
	roots    []*x509.Certificate
	gen      uint64
	ca       *testkit.CA
	endpoint *httptest.Server
	follower *Follower
}

func (d *domain) current() ([]*x509.Certificate, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.roots, d.gen
}

func (d *domain) rotate(t *testing.T) {
	ca := testkit.NewCA(t, d.td.Name()+" root 2", nil, time.Now(), 24*time.Hour)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ca, d.roots, d.gen = ca, append([]*x509.Certificate{ca.Cert}, d.roots...), d.gen+1
}

func (d *domain) svid(t *testing.T, path string) *x509svid.SVID {
	id := spiffeid.RequireFromPath(d.td, path)
	d.mu.Lock()
	ca := d.ca
	d.mu.Unlock()
	leaf := ca.Issue(t, testkit.Spec{ID: id.String()})
	return &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{leaf.Cert}, PrivateKey: leaf.Key}
}

// newDomain starts td's bundle endpoint over HTTPS (web-PKI: the test server's
// certificate, trusted through webRoots by the followers).
func newDomain(t *testing.T, name string, hint time.Duration) *domain {
	td := spiffeid.RequireTrustDomainFromString(name)
	ca := testkit.NewCA(t, name+" root", nil, time.Now(), 24*time.Hour)
	d := &domain{td: td, ca: ca, roots: []*x509.Certificate{ca.Cert}, gen: 1}
	h, err := Handler(td, d.current, hint)
	if err != nil {
		t.Fatal(err)
	}
	d.endpoint = httptest.NewTLSServer(h)
	t.Cleanup(d.endpoint.Close)
	return d
}

func (d *domain) follow(t *testing.T, webRoots *x509.CertPool) {
	f, err := NewFollower(Config{Self: d.td, WebPKIRoots: webRoots, MinRefresh: 20 * time.Millisecond, MaxRefresh: time.Minute}, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	d.follower = f
	t.Cleanup(testkit.Background(t, f.Run))
}

// trusted is what a pod of d verifies peers against: its own roots and the
// followed foreign bundles, each under its own trust domain.
func (d *domain) trusted() *spiffebundle.Set {
	set := d.follower.Bundles()
	roots, _ := d.current()
	set.Add(spiffebundle.FromX509Authorities(d.td, roots))
	return set
}

func TestBundleEndpointServesSPIFFEBundle(t *testing.T) {
	d := newDomain(t, "east.example", 90*time.Second)
	resp, err := d.endpoint.Client().Get(d.endpoint.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Keys []struct {
			Use string   `json:"use"`
			X5c []string `json:"x5c"`
		} `json:"keys"`
		Hint int64  `json:"spiffe_refresh_hint"`
		Seq  uint64 `json:"spiffe_sequence"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Hint != 90 || doc.Seq != 1 || len(doc.Keys) != 1 || doc.Keys[0].Use != "x509-svid" || len(doc.Keys[0].X5c) != 1 {
		t.Fatalf("bundle document = %+v", doc)
	}
	post, err := d.endpoint.Client().Post(d.endpoint.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST status = %d", post.StatusCode)
	}
}

// Two trust domains federated through their bundle endpoints: a client in one
// and a server in the other complete mTLS with SPIFFE ID checks; a rotation in
// one is followed by its hint; removing federation ends it.
func TestTwoTrustDomainsFederate(t *testing.T) {
	east := newDomain(t, "east.example", time.Second)
	west := newDomain(t, "west.example", time.Second)
	webRoots := x509.NewCertPool()
	webRoots.AddCert(east.endpoint.Certificate())
	webRoots.AddCert(west.endpoint.Certificate())
	east.follow(t, webRoots)
	west.follow(t, webRoots)

	// Before federation: the west server does not know east's roots.
	clientID := spiffeid.RequireFromPath(east.td, "/ns/shop/sa/frontend")
	serverID := spiffeid.RequireFromPath(west.td, "/ns/pay/sa/api")
	if err := handshake(t, east, west, clientID, serverID); err == nil {
		t.Fatal("handshake across unfederated trust domains succeeded")
	}

	if err := east.follower.Follow([]Source{{TrustDomain: west.td, URL: west.endpoint.URL}}); err != nil {
		t.Fatal(err)
	}
	if err := west.follower.Follow([]Source{{TrustDomain: east.td, URL: east.endpoint.URL}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "east and west follow each other", func() bool {
		_, e := east.follower.Bundles().Get(west.td)
		_, w := west.follower.Bundles().Get(east.td)
		return e && w
	})
	if err := handshake(t, east, west, clientID, serverID); err != nil {
		t.Fatalf("federated handshake: %v", err)
	}
	// The server checks the client's ID: a different workload is refused.
	other := spiffeid.RequireFromPath(east.td, "/ns/shop/sa/other")
	if err := handshake(t, east, west, other, serverID); err == nil {
		t.Fatal("server accepted a client ID it does not authorize")
	}
	// Roots stay apart: west's roots do not vouch for an east ID.
	if b, _ := east.follower.Bundles().Get(west.td); b.HasX509Authority(east.ca.Cert) {
		t.Fatal("east's root is in west's bundle")
	}

	// West rotates to a new root; east picks it up by the refresh hint.
	west.rotate(t)
	testkit.Eventually(t, "east follows west's rotation", func() bool {
		for _, s := range east.follower.Status() {
			if s.TrustDomain == "west.example" && s.Sequence == 2 && s.Roots == 2 {
				return true
			}
		}
		return false
	})
	if err := handshake(t, east, west, clientID, serverID); err != nil {
		t.Fatalf("handshake after west's rotation: %v", err)
	}

	// Federation removed on the west side: the handshake fails again.
	if err := west.follower.Follow(nil); err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, east, west, clientID, serverID); err == nil {
		t.Fatal("handshake succeeded after federation was removed")
	}
}

// handshake runs one mTLS exchange between a client of c and a server of s,
// each trusting what its own domain trusts, each checking the other's ID.
func handshake(t *testing.T, c, s *domain, clientID, serverID spiffeid.ID) error {
	t.Helper()
	cSVID, sSVID := c.svid(t, clientID.Path()), s.svid(t, serverID.Path())
	serverConf := tlsconfig.MTLSServerConfig(sSVID, s.trusted(), tlsconfig.AuthorizeID(spiffeid.RequireFromPath(c.td, "/ns/shop/sa/frontend")))
	clientConf := tlsconfig.MTLSClientConfig(cSVID, c.trusted(), tlsconfig.AuthorizeID(serverID))
	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverConf)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer conn.Close()
		err = conn.(*tls.Conn).Handshake()
		if err == nil {
			_, err = conn.Write([]byte("ok"))
		}
		srvErr <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: clientConf}
	conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		<-srvErr
		return err
	}
	defer conn.Close()
	buf := make([]byte, 2)
	_, rerr := conn.Read(buf)
	if serr := <-srvErr; serr != nil {
		return serr
	}
	return rerr
}

func TestParseEndpoints(t *testing.T) {
	got, err := ParseEndpoints("west.example|https://west:8443/bundle||north.example|https://north/b")
	if err != nil || len(got) != 2 || got[0].TrustDomain.Name() != "west.example" || got[1].URL != "https://north/b" {
		t.Fatalf("ParseEndpoints = %+v, %v", got, err)
	}
	if got, err := ParseEndpoints(""); err != nil || got != nil {
		t.Fatalf("empty = %v, %v", got, err)
	}
	_, err = ParseEndpoints("west.example|http://west/b||BAD TD|https://x||nopipe||west.example|https://again")
	for _, want := range []string{"entry 1", "entry 2", "entry 3", "entry 4"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v does not name %s", err, want)
		}
	}
}

func TestStaticBundleFile(t *testing.T) {
	west := newDomain(t, "west.example", 0)
	roots, gen := west.current()
	data, err := BundleOf(west.td, roots, gen, time.Minute).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "west.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	srcs, err := ParseFiles("west.example|" + path)
	if err != nil {
		t.Fatal(err)
	}
	f := running(t, Config{Self: spiffeid.RequireTrustDomainFromString("east.example"), MinRefresh: 10 * time.Millisecond}, srcs)
	testkit.Eventually(t, "static bundle loaded", func() bool {
		b, ok := f.Bundles().Get(west.td)
		return ok && b.HasX509Authority(roots[0])
	})
	st := f.Status()
	if len(st) != 1 || st[0].Where != "file:"+path || st[0].RefreshHint != time.Minute {
		t.Fatalf("status = %+v", st)
	}
}

func TestFollowRefusesBadSources(t *testing.T) {
	self := spiffeid.RequireTrustDomainFromString("east.example")
	f, err := NewFollower(Config{Self: self}, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	west := spiffeid.RequireTrustDomainFromString("west.example")
	good := Source{TrustDomain: west, URL: "https://west/b"}
	if err := f.Follow([]Source{good}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]Source{
		{{TrustDomain: self, URL: "https://east/b"}},
		{{TrustDomain: west, URL: "https://a", File: "/b"}},
		{good, good},
	} {
		if err := f.Follow(bad); err == nil {
			t.Fatalf("Follow(%+v) accepted", bad)
		}
	}
	if st := f.Status(); len(st) != 1 || st[0].Where != "https://west/b" {
		t.Fatalf("bad input changed the followed set: %+v", st)
	}
}

// spiffeEndpoint serves d's bundle over HTTPS with an X509-SVID of id, issued at
// each handshake by the CA serving returns (as a signer with
// -bundle-endpoint-spiffe-id issues its own).
func (d *domain) spiffeEndpoint(t *testing.T, id spiffeid.ID, serving func() *testkit.CA) string {
	h, err := Handler(d.td, d.current, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A listener of our own: httptest's StartTLS would add its own certificate,
	// which Go serves to a client that sends no server name.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		l := serving().Issue(t, testkit.Spec{ID: id.String()})
		return &tls.Certificate{Certificate: [][]byte{l.Cert.Raw}, PrivateKey: l.Key, Leaf: l.Cert}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return "https://" + ln.Addr().String()
}

// writeBundle writes roots as d's SPIFFE bundle file (what an operator got once,
// out of band) and returns its path.
func writeBundle(t *testing.T, td spiffeid.TrustDomain, roots []*x509.Certificate) string {
	data, err := BundleOf(td, roots, 1, time.Minute).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), td.Name()+".json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// https_spiffe: the endpoint is authenticated by its SVID against the domain's
// own bundle — the bootstrap file first, then the bundle fetched last, so once the
// domain has published a new root and moved its endpoint to it, the new root
// (which the bootstrap file does not hold) authenticates it. An endpoint with
// another SPIFFE ID, or a bootstrap of another CA, is refused and nothing is taken
// from it.
func TestFollowSPIFFEAuthenticatedEndpoint(t *testing.T) {
	west := newDomain(t, "west.example", 0)
	endpointID := spiffeid.RequireFromPath(west.td, "/bundle-endpoint")
	var serving atomic.Pointer[testkit.CA]
	serving.Store(west.ca)
	url := west.spiffeEndpoint(t, endpointID, serving.Load)
	roots, _ := west.current()
	bootstrap := writeBundle(t, west.td, roots)
	eps, err := ParseEndpoints("west.example|" + url + "|" + endpointID.String())
	if err != nil {
		t.Fatal(err)
	}
	files, err := ParseFiles("west.example|" + bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := WithBootstraps(eps, files)
	if err != nil || len(srcs) != 1 || srcs[0].Bootstrap != bootstrap || srcs[0].File != "" {
		t.Fatalf("WithBootstraps = %+v, %v", srcs, err)
	}
	self := spiffeid.RequireTrustDomainFromString("east.example")
	f := running(t, Config{Self: self, MinRefresh: 20 * time.Millisecond, MaxRefresh: 50 * time.Millisecond}, srcs)
	testkit.Eventually(t, "west's bundle fetched over https_spiffe", func() bool {
		b, ok := f.Bundles().Get(west.td)
		return ok && b.HasX509Authority(roots[0])
	})
	if st := f.Status(); !strings.Contains(st[0].Where, "https_spiffe "+endpointID.String()) {
		t.Fatalf("status = %+v", st)
	}
	// West publishes a new root (its endpoint still on the old one), then moves
	// its endpoint to it: the bootstrap file does not hold the new root, the
	// bundle fetched last does.
	west.rotate(t)
	newRoots, _ := west.current()
	testkit.Eventually(t, "west's new root followed", func() bool {
		b, ok := f.Bundles().Get(west.td)
		return ok && b.HasX509Authority(newRoots[0])
	})
	west.mu.Lock()
	serving.Store(west.ca)
	west.mu.Unlock()
	moved := time.Now()
	testkit.Eventually(t, "fetched from the endpoint on its new root", func() bool {
		st := f.Status()
		return len(st) == 1 && st[0].Err == "" && st[0].FetchedAt.After(moved.Add(100*time.Millisecond))
	})

	for _, tc := range []struct {
		name, entry, bootstrap, want string
	}{
		{"another endpoint ID", url + "|spiffe://west.example/not-the-endpoint", writeBundle(t, west.td, newRoots), "unexpected ID"},
		{"a bootstrap of another CA", url + "|" + endpointID.String(), writeBundle(t, west.td, []*x509.Certificate{testkit.NewCA(t, "impostor", nil, time.Now(), time.Hour).Cert}), "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := ParseEndpoints("west.example|" + tc.entry)
			if err != nil {
				t.Fatal(err)
			}
			files, _ := ParseFiles("west.example|" + tc.bootstrap)
			srcs, err := WithBootstraps(eps, files)
			if err != nil {
				t.Fatal(err)
			}
			g := running(t, Config{Self: self, MinRefresh: 20 * time.Millisecond}, srcs)
			testkit.Eventually(t, "fetch refused: "+tc.want, func() bool {
				st := g.Status()
				return len(st) == 1 && strings.Contains(st[0].Err, tc.want)
			})
			if _, ok := g.Bundles().Get(west.td); ok {
				t.Fatal("a bundle was taken from an endpoint that failed authentication")
			}
		})
	}
}

func TestParseSPIFFEEndpointsAndBootstraps(t *testing.T) {
	for _, bad := range []string{
		"west.example|https://w/b|spiffe://east.example/endpoint", // ID of another domain
		"west.example|https://w/b|not-a-spiffe-id",
	} {
		if _, err := ParseEndpoints(bad); err == nil {
			t.Errorf("ParseEndpoints(%q) accepted", bad)
		}
	}
	spiffeEP, _ := ParseEndpoints("west.example|https://w/b|spiffe://west.example/endpoint")
	webEP, _ := ParseEndpoints("west.example|https://w/b")
	file, _ := ParseFiles("west.example|/w.json")
	if _, err := WithBootstraps(spiffeEP, nil); err == nil || !strings.Contains(err.Error(), "needs the domain's bundle once") {
		t.Errorf("https_spiffe without a bootstrap: %v", err)
	}
	if _, err := WithBootstraps(webEP, file); err == nil || !strings.Contains(err.Error(), "both a web-PKI endpoint and a bundle file") {
		t.Errorf("web endpoint and file for one domain: %v", err)
	}
	if got, err := WithBootstraps(webEP, nil); err != nil || len(got) != 1 || !got[0].EndpointID.IsZero() {
		t.Errorf("web endpoint alone: %+v, %v", got, err)
	}
}

// running is a follower of srcs with cfg, run until the test ends.
func running(t *testing.T, cfg Config, srcs []Source) *Follower {
	t.Helper()
	f, err := NewFollower(cfg, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(testkit.Background(t, f.Run))
	if err := f.Follow(srcs); err != nil {
		t.Fatal(err)
	}
	return f
}
