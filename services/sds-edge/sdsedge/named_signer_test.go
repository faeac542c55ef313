package sdsedge_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/tests/testkit"
)

// namedSigner is a named signer (the signer's CERT_SIGNERS) with a CA of its own:
// a request asking for name is signed by ca, and the reply vouches for ca's root
// as the signer does (endorsed by the mesh CA for name), or as a broken or rogue
// responder would.
type namedSigner struct {
	name string
	ca   *testkit.CA
	// vouchAs is the signer name the roots are endorsed for (the signer: name).
	vouchAs string
	// by endorses the roots; nil: the reply carries none.
	by crypto.Signer
}

// signAs signs as sign does, or, when the request asks for the named signer, with
// that signer's CA, returning the SignerRoots its reply carries.
func (c *testCA) signAs(csrPEM []byte, id string, ttl time.Duration, signer string) ([]string, *events.SignerRoots, error) {
	n := c.named.Load()
	if n == nil || signer != n.name {
		chain, err := c.sign(csrPEM, id, ttl)
		return chain, nil, err
	}
	csr, err := pki.ParseCSR(csrPEM)
	if err != nil {
		return nil, nil, err
	}
	u, _ := url.Parse(id)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial(), URIs: []*url.URL{u}, NotBefore: now.Add(-time.Second), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, n.ca.Cert, csr.PublicKey, n.ca.Key)
	if err != nil {
		return nil, nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	chain := pki.CertPEMs([]*x509.Certificate{leaf, n.ca.Cert})
	if n.by == nil {
		return chain, nil, nil
	}
	roots := []string{n.ca.PEM()}
	es, err := trustbundle.EndorseSigner(c.td, n.vouchAs, roots, n.by)
	if err != nil {
		return nil, nil, err
	}
	return chain, &events.SignerRoots{Name: n.vouchAs, Roots: roots, Endorsements: es}, nil
}

// partnerCA is a named signer's own root, outside the mesh's.
func partnerCA(t testing.TB) *testkit.CA {
	return testkit.NewCA(t, "partner root", nil, time.Now().Add(-time.Hour), 10*24*time.Hour)
}

// TestNamedSignerChainServedWhenTheMeshCAVouches (issue 28): a pod asking for a
// named signer (ISTIO_META_CERT_SIGNER) whose CA has a root of its own takes the
// chain to that root when the reply carries the root endorsed by the mesh CA,
// serves it, and serves the signer's root in ROOTCA beside the mesh's; on the bus
// and over Istio's gRPC API, where the signer's name goes as Istio's agent sends
// it (the request's metadata, CertSigner) and the endorsed roots come back in a
// response header.
func TestNamedSignerChainServedWhenTheMeshCAVouches(t *testing.T) {
	for _, transport := range []string{"bus", "grpc"} {
		t.Run(transport, func(t *testing.T) {
			v := newEnv(t)
			partner := partnerCA(t)
			v.ca.named.Store(&namedSigner{name: "partner", ca: partner, vouchAs: "partner", by: v.ca.keys[0]})
			o := podOpt{env: map[string]string{"ISTIO_META_CERT_SIGNER": "partner"}}
			if transport == "grpc" {
				o.root = testkit.ShortDir(t)
				rootFile := filepath.Join(o.root, "ca-root.pem")
				if err := os.WriteFile(rootFile, []byte(v.ca.bundle()[0]), 0o644); err != nil {
					t.Fatal(err)
				}
				o.args = []string{"-ca-addr", v.ca.serveGRPC(t), "-ca-root-cert", rootFile}
			}
			p := v.startPod(o)
			got := waitSecrets(t, p, "default", "ROOTCA")
			chain, err := pki.ParseCertsPEM(got["default"].CertChain)
			if err != nil {
				t.Fatal(err)
			}
			if !chain[len(chain)-1].Equal(partner.Cert) {
				t.Fatalf("served chain ends at %s, want the partner root", chain[len(chain)-1].Subject)
			}
			if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool(partner.Cert), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Fatalf("served leaf does not verify to the partner root: %v", err)
			}
			roots, _ := pki.ParseCertsPEM(got["ROOTCA"].TrustedCA)
			if !slices.ContainsFunc(roots, partner.Cert.Equal) || !slices.ContainsFunc(roots, v.ca.roots[0].Equal) {
				t.Fatalf("ROOTCA holds %d roots, want the mesh's and the partner's", len(roots))
			}
			if transport == "grpc" {
				if s := v.ca.lastSigner.Load(); s == nil || *s != "partner" {
					t.Fatalf("CreateCertificate's metadata CertSigner = %v, want partner", s)
				}
			}
			if n := p.rejected(t, "sign-reply"); n != 0 {
				t.Fatalf("%v sign replies refused", n)
			}
		})
	}
}

// TestNamedSignerChainRefusedWithoutTheMeshCAsWord: a chain to a named signer's
// root is still refused (nothing served, the refusal counted) when the reply does
// not vouch for that root, vouches with a key the pod does not trust, vouches for
// another signer than the one asked for, or comes to a pod that asked for none.
func TestNamedSignerChainRefusedWithoutTheMeshCAsWord(t *testing.T) {
	stranger := partnerCA(t)
	for _, tc := range []struct {
		name          string
		asked, vouch  string
		byStranger    bool
		noEndorsement bool
	}{
		{name: "no endorsement", asked: "partner", vouch: "partner", noEndorsement: true},
		{name: "endorsed by a key the pod does not trust", asked: "partner", vouch: "partner", byStranger: true},
		{name: "endorsed for another signer", asked: "partner", vouch: "other"},
		{name: "the pod asked for no signer", asked: "", vouch: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			ns := &namedSigner{name: tc.asked, ca: partnerCA(t), vouchAs: tc.vouch, by: v.ca.keys[0]}
			if tc.byStranger {
				ns.by = stranger.Key
			}
			if tc.noEndorsement {
				ns.by = nil
			}
			if ns.vouchAs == "" {
				ns.vouchAs = "partner" // a signer's roots in a reply to a pod that asked for none
			}
			v.ca.named.Store(ns)
			p := v.startPod(podOpt{env: map[string]string{"ISTIO_META_CERT_SIGNER": tc.asked}})
			testkit.Eventually(t, "the chain refused twice", func() bool { return p.rejected(t, "sign-reply") >= 2 })
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if got, err := sdsclient.Fetch(ctx, p.dial(t), "sidecar~10.0.0.1~"+testPod+".default~default.svc.cluster.local", "default"); err == nil {
				t.Fatalf("default served after a refused chain: %d bytes", len(got["default"].CertChain))
			}
		})
	}
}

// waitSecrets opens one stream for names and returns each once all have come.
func waitSecrets(t *testing.T, p *pod, names ...string) map[string]sdsclient.Secret {
	t.Helper()
	st := p.open(t, p.dial(t), names...)
	got := map[string]sdsclient.Secret{}
	for len(got) < len(names) {
		for n, s := range recv(t, st).Secrets {
			got[n] = s
		}
	}
	return got
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}
