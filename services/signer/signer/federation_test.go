package signer

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// mesh is one trust domain of the federation test: its own bus and signer,
// and a pod's view of what it trusts, learnt from the bus as a pod learns it.
type mesh struct {
	td      spiffeid.TrustDomain
	e       *env
	cfg     config.Config
	home    *trustbundle.Set
	foreign *trustbundle.Foreign
}

// endpointCert writes a web-PKI certificate for 127.0.0.1 and returns its files.
func endpointCert(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	l := testkit.SelfSigned(t, testkit.Spec{Name: "bundle endpoint", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, []byte(l.PEM()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, []byte(l.KeyPEM(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, l.Cert
}

func newMesh(t *testing.T, td string) (*mesh, *x509.Certificate) {
	m := &mesh{td: spiffeid.RequireTrustDomainFromString(td), e: newEnv(t)}
	m.cfg = m.e.config("signer-" + td)
	m.cfg.TrustDomain = td
	m.cfg.Federation.Listen = testkit.FreeAddr(t)
	var cert *x509.Certificate
	m.cfg.Federation.CertFile, m.cfg.Federation.KeyFile, cert = endpointCert(t, t.TempDir())
	m.cfg.Federation.RefreshHint = time.Second
	m.cfg.Federation.MinRefresh = 50 * time.Millisecond
	return m, cert
}

// watch is the pod's side: its home roots from the bundle reply, foreign roots
// from trust.federated, taken only when its own CA endorsed them.
func (m *mesh) watch(t *testing.T) {
	b := bundle(t, m.e.nc)
	m.home = trustbundle.New(m.td.Name(), nil, nil)
	u, err := m.home.Check(trustbundle.FromBundleReply(b))
	if err != nil {
		t.Fatal(err)
	}
	m.home.Apply(u)
	m.foreign = trustbundle.NewForeign(m.home)
	sub, err := m.e.nc.Subscribe(events.TrustFederatedWildcard, func(msg *nats.Msg) {
		ev, _, err := events.Decode[events.TrustFederated](msg)
		if err == nil {
			_, err = m.foreign.Apply(ev)
		}
		if err != nil {
			t.Errorf("trust.federated refused: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := m.e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// svid is a workload certificate the mesh's signer issued for ns/sa.
func (m *mesh) svid(t *testing.T, ns, sa string) *x509svid.SVID {
	key, csr := signertest.CSR(t, pki.ECP256, "spiffe://"+m.td.Name()+"/ns/"+ns+"/sa/"+sa)
	rep := natsSign(t, m.e.nc, events.SignRequest{CSR: string(csr), Token: m.e.token(t, ns, sa), TTL: time.Hour})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	chain, err := pki.ParseCertPEMs(rep.CertChain)
	if err != nil {
		t.Fatal(err)
	}
	s, err := x509svid.ParseRaw(derOf(chain), mustPKCS8(t, key))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// trusted is the pod's bundle set: each domain's roots under its own name.
func (m *mesh) trusted() *x509bundle.Set {
	set := x509bundle.NewSet(x509bundle.FromX509Authorities(m.td, m.home.Roots()))
	for _, d := range m.foreign.Domains() {
		set.Add(x509bundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString(d.TrustDomain), d.Roots))
	}
	return set
}

func derOf(cs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range cs {
		out = append(out, c.Raw...)
	}
	return out
}

func mustPKCS8(t *testing.T, k crypto.Signer) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// Two meshagent trust domains, each its own bus and signer and root, federated
// through their SPIFFE bundle endpoints (web-PKI): a client in east and a server
// in west complete mTLS with SPIFFE ID checks using the bundles their pods got
// from the bus, and stop being able to once west no longer follows east.
func TestTwoTrustDomainsFederateThroughBundleEndpoints(t *testing.T) {
	east, eastCert := newMesh(t, "east.example")
	west, westCert := newMesh(t, "west.example")
	caFile := filepath.Join(t.TempDir(), "endpoints.pem")
	if err := os.WriteFile(caFile, append(pki.EncodeCertPEM(eastCert), pki.EncodeCertPEM(westCert)...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ m, other *mesh }{{east, west}, {west, east}} {
		p.m.cfg.Federation.CAFile = caFile
		p.m.cfg.Federation.Endpoints = p.other.td.Name() + "|https://" + p.other.cfg.Federation.Listen
	}
	eastSigner := east.e.start(t, east.cfg)
	westCtx, stopWest := context.WithCancel(context.Background())
	westSigner := west.e.build(t, west.cfg, nil)
	westDone := make(chan error, 1)
	go func() { westDone <- westSigner.Run(westCtx) }()
	// West is run by hand (it is restarted below), so wait for it as start waits
	// for east: ready means it answers on the bus too, which watch asks next.
	testkit.Eventually(t, "both bundle endpoints bound, west ready", func() bool {
		return eastSigner.BundleEndpointAddr() != nil && westSigner.BundleEndpointAddr() != nil && westSigner.ready() == nil
	})
	east.watch(t)
	west.watch(t)

	client := east.svid(t, "shop", "frontend")
	server := west.svid(t, "pay", "api")
	testkit.Eventually(t, "each pod holds the other domain's roots", func() bool {
		return len(east.foreign.Roots("west.example")) == 1 && len(west.foreign.Roots("east.example")) == 1
	})
	// Each domain's roots stay apart: east's root vouches for nothing in west.
	if east.foreign.Roots("west.example")[0].Equal(east.home.Roots()[0]) {
		t.Fatal("two trust domains share a root")
	}
	if err := mtls(t, east.trusted(), west.trusted(), client, server); err != nil {
		t.Fatalf("federated mTLS: %v", err)
	}
	// The server checks the client's SPIFFE ID: another east workload is refused.
	if err := mtls(t, east.trusted(), west.trusted(), east.svid(t, "shop", "intruder"), server); err == nil {
		t.Fatal("server accepted a client ID it does not authorize")
	}

	// West restarts without following east: it announces east removed, west's
	// pod drops east's roots, and the handshake fails.
	stopWest()
	if err := <-westDone; err != nil {
		t.Fatal(err)
	}
	west.cfg.Federation.Endpoints = ""
	west.cfg.Federation.Listen = ""
	west.e.start(t, west.cfg)
	testkit.Eventually(t, "west's pod no longer trusts east", func() bool {
		return west.foreign.Roots("east.example") == nil
	})
	if err := mtls(t, east.trusted(), west.trusted(), client, server); err == nil {
		t.Fatal("mTLS succeeded after federation was removed")
	}
}

// mtls runs one handshake: client (trusting clientTrust) to server (trusting
// serverTrust), each authorizing the other's expected SPIFFE ID.
func mtls(t *testing.T, clientTrust, serverTrust *x509bundle.Set, client, server *x509svid.SVID) error {
	t.Helper()
	wantClient := spiffeid.RequireFromString("spiffe://east.example/ns/shop/sa/frontend")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(server, serverTrust, tlsconfig.AuthorizeID(wantClient)))
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
		if err = conn.(*tls.Conn).Handshake(); err == nil {
			_, err = conn.Write([]byte("ok"))
		}
		srvErr <- err
	}()
	d := tls.Dialer{Config: tlsconfig.MTLSClientConfig(client, clientTrust, tlsconfig.AuthorizeID(server.ID))}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-srvErr
		return err
	}
	defer conn.Close()
	_, rerr := conn.Read(make([]byte, 2))
	if serr := <-srvErr; serr != nil {
		return serr
	}
	return rerr
}

// The https_spiffe profile between two real signers: west serves its bundle
// endpoint with an X509-SVID its own CA issued (-bundle-endpoint-spiffe-id); east
// follows it by that SPIFFE ID, authenticated with west's bundle given once as a
// file, and its pod gets west's roots from its own bus. Following the same
// endpoint under another ID gets nothing.
func TestFederationOverSPIFFEAuthenticatedEndpoint(t *testing.T) {
	west, _ := newMesh(t, "west.example")
	west.cfg.Federation.CertFile, west.cfg.Federation.KeyFile = "", ""
	west.cfg.Federation.SPIFFEID = "spiffe://west.example/ns/istio-system/sa/bundle-endpoint"
	westSigner := west.e.start(t, west.cfg)
	testkit.Eventually(t, "west's bundle endpoint bound", func() bool { return westSigner.BundleEndpointAddr() != nil })
	westRoots, err := pki.ParseCertPEMs(bundle(t, west.e.nc).Roots)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := spiffebundle.FromX509Authorities(west.td, westRoots).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	bootFile := filepath.Join(t.TempDir(), "west.json")
	if err := os.WriteFile(bootFile, boot, 0o600); err != nil {
		t.Fatal(err)
	}
	follow := func(id string) (*mesh, *replica) {
		east, _ := newMesh(t, "east.example")
		east.cfg.Federation.Listen = ""
		east.cfg.Federation.Endpoints = "west.example|https://" + west.cfg.Federation.Listen + "|" + id
		east.cfg.Federation.Files = "west.example|" + bootFile
		r := east.e.start(t, east.cfg)
		east.watch(t)
		return east, r
	}
	east, _ := follow(west.cfg.Federation.SPIFFEID)
	testkit.Eventually(t, "east's pod holds west's roots", func() bool {
		got := east.foreign.Roots("west.example")
		return len(got) == 1 && got[0].Equal(westRoots[0])
	})
	// East's pod verifies a west workload against west's roots.
	server := west.svid(t, "pay", "api")
	if _, _, err := x509svid.Verify(server.Certificates, east.trusted()); err != nil {
		t.Fatalf("east does not verify west's workload: %v", err)
	}

	wrong, wrongSigner := follow("spiffe://west.example/ns/istio-system/sa/not-the-endpoint")
	testkit.Eventually(t, "the fetch refused for the endpoint's SPIFFE ID", func() bool {
		st := wrongSigner.fed.Followed()
		return len(st) == 1 && strings.Contains(st[0].Err, "unexpected ID")
	})
	if wrong.foreign.Roots("west.example") != nil {
		t.Fatal("roots taken from an endpoint that is not the SPIFFE ID followed")
	}
}
