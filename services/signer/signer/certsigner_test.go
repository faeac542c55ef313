package signer

import (
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A request naming a signer (Istio's CertSigner metadata, allowed by CERT_SIGNERS)
// gets that signer's chain, from its own cacerts directory; one not allowed, or
// allowed but without material, gets a clear refusal; no CertSigner gets the mesh CA.
func TestNamedSignerChains(t *testing.T) {
	now := time.Now()
	meshRoot, _, dir := pluggedCADir(t, now)
	partnerRoot := testkit.NewCA(t, "partner-root", nil, now, 48*time.Hour)
	partner := testkit.NewCA(t, "partner-inter", partnerRoot, now, 24*time.Hour)
	if err := os.Mkdir(filepath.Join(dir, "partner"), 0o700); err != nil {
		t.Fatal(err)
	}
	signertest.WriteCACerts(t, filepath.Join(dir, "partner"), partner, []*x509.Certificate{partnerRoot.Cert}, partnerRoot.Cert)

	e := newEnv(t)
	cfg := e.config("signer-a")
	cfg.CA.Dir, cfg.Certs.SignersDir = dir, dir
	cfg.Certs.Signers = []string{"partner", "empty"}
	s := e.start(t, cfg)
	meshPEM := string(pki.EncodeCertPEM(meshRoot.Cert))
	c := istioClient(t, s, []string{meshPEM}, nil, time.Now)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	tok := e.token(t, "shop", "web")

	got, err := istioCreate(c, tok, "partner", csr, 3600)
	if err != nil {
		t.Fatalf("named signer: %v", err)
	}
	partnerPEM := string(pki.EncodeCertPEM(partnerRoot.Cert))
	if last := got.CertChain[len(got.CertChain)-1]; last != partnerPEM {
		t.Fatalf("chain ends at %q, want the partner signer's root", last)
	}
	leaf := verifyChain(t, got.CertChain, []string{partnerPEM}, time.Now())
	if leaf.URIs[0].String() != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Fatalf("leaf %v", leaf.URIs)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(meshRoot.Cert), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
		t.Fatal("the partner signer's leaf verifies under the mesh root")
	}
	// Its record names the signer: readers tell a named signer's root from a broken chain.
	if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); ev.CertSigner != "partner" || ev.Serial != pki.SerialHex(leaf) {
		t.Fatalf("cert.issued of the partner's certificate: signer %q serial %s", ev.CertSigner, ev.Serial)
	}

	// The mesh CA vouches for the partner's root to the pod that asked for it
	// (issue 28): over gRPC in a response header Istio's agents ignore, on the bus
	// in the reply, each verifying under the mesh root, for that signer only.
	var header metadata.MD
	if _, err := istioCreateOpts(c, tok, "partner", csr, 3600, grpc.Header(&header)); err != nil {
		t.Fatal(err)
	}
	var vouched events.SignerRoots
	if v := header.Get(events.SignerRootsHeader); len(v) != 1 || json.Unmarshal([]byte(v[0]), &vouched) != nil {
		t.Fatalf("header %s: %q", events.SignerRootsHeader, v)
	}
	checkVouched := func(how string, s *events.SignerRoots) {
		t.Helper()
		if s == nil {
			t.Fatalf("%s: no signer roots", how)
		}
		roots, err := trustbundle.VerifySigner([]*x509.Certificate{meshRoot.Cert}, "cluster.local", *s)
		if err != nil || len(roots) != 1 || !roots[0].Equal(partnerRoot.Cert) || s.Name != "partner" {
			t.Fatalf("%s: signer roots %v (%v), want the partner root endorsed by the mesh's", how, roots, err)
		}
		if _, err := trustbundle.VerifySigner([]*x509.Certificate{partnerRoot.Cert}, "cluster.local", *s); err == nil {
			t.Fatalf("%s: endorsement verifies under the partner's own root", how)
		}
	}
	checkVouched("grpc header", &vouched)
	rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: tok, CertSigner: "partner"})
	if rep.Error != nil {
		t.Fatalf("bus: %v", rep.Error)
	}
	checkVouched("bus", rep.Signer)
	if mine := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: tok}); mine.Error != nil || mine.Signer != nil {
		t.Fatalf("bus, the mesh CA's certificate: signer roots %+v, error %v", mine.Signer, mine.Error)
	}

	def, err := istioCreate(c, tok, "", csr, 3600)
	if err != nil || def.CertChain[len(def.CertChain)-1] != meshPEM {
		t.Fatalf("default signer: %v", err)
	}
	if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); ev.CertSigner != "" {
		t.Fatalf("the mesh CA's certificate recorded under signer %q", ev.CertSigner)
	}
	for _, tc := range []struct{ signer, want string }{
		{"kubernetes.io/legacy-unknown", "unknown cert signer"},
		{"empty", `cert signer "empty": CA material in ` + filepath.Join(dir, "empty")},
	} {
		_, err := istioCreate(c, tok, tc.signer, csr, 3600)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("signer %q: got %v, want InvalidArgument naming %q", tc.signer, err, tc.want)
		}
	}
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}
