package signer

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Renewal by certificate over gRPC takes the identity from the client certificate,
// never the CSR; an expired certificate, or one from a foreign root, is refused
// naming why.
func TestGRPCRenewalByCertificate(t *testing.T) {
	now := time.Now()
	meshRoot, inter, dir := pluggedCADir(t, now)
	e := newEnv(t)
	cfg := e.config("signer-a")
	cfg.CA.Dir = dir
	s := e.start(t, cfg)
	roots := []string{string(pki.EncodeCertPEM(meshRoot.Cert))}
	_, csr := signertest.CSR(t, pki.ECP256, "spiffe://cluster.local/ns/shop/sa/admin")

	present := func(l *testkit.Leaf) (string, error) {
		c := tls.Certificate{Certificate: [][]byte{l.Cert.Raw, inter.Cert.Raw}, PrivateKey: l.Key}
		resp, err := istioCreate(istioClient(t, s, roots, &c, time.Now), "", "", csr, 600)
		if err != nil {
			return "", err
		}
		return verifyChain(t, resp.CertChain, roots, time.Now()).URIs[0].String(), nil
	}
	id, err := present(inter.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/shop/sa/web"}))
	if err != nil || id != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Fatalf("valid certificate: %s, %v (the CSR asked for sa/admin)", id, err)
	}
	for _, tc := range []struct {
		name string
		leaf *testkit.Leaf
		want string
	}{
		{"expired", inter.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/shop/sa/web", NotBefore: now.Add(-3 * time.Hour), Life: time.Hour}), "expired"},
		{"foreign root", testkit.NewCA(t, "foreign", nil, now, time.Hour).Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/shop/sa/web"}), "unknown authority"},
		{"foreign trust domain", inter.Issue(t, testkit.Spec{ID: "spiffe://other.example/ns/shop/sa/web"}), "trust domain"},
	} {
		_, err := present(tc.leaf)
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: got %v, want Unauthenticated naming %q", tc.name, err, tc.want)
		}
	}
}
