package cli

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	securityv1 "istio.io/api/security/v1alpha1"
)

// caStandIn answers CreateCertificate over TLS, signing for the identity it is
// asked (the CSR's URI) and recording what it was sent: metadata, request fields and
// the client certificate.
type caStandIn struct {
	securityv1.UnimplementedIstioCertificateServiceServer
	ca *testkit.CA
	t  *testing.T

	mu     sync.Mutex
	md     metadata.MD
	fields map[string]string
	peer   string // the client certificate's URI, "" without one
}

func (s *caStandIn) CreateCertificate(ctx context.Context, req *securityv1.IstioCertificateRequest) (*securityv1.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	fields := map[string]string{}
	for k, v := range req.GetMetadata().GetFields() {
		fields[k] = v.GetStringValue()
	}
	p, _ := peer.FromContext(ctx)
	var from string
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		from = ti.State.PeerCertificates[0].URIs[0].String()
	}
	csr, err := pki.ParseCSR([]byte(req.GetCsr()))
	if err != nil {
		return nil, err
	}
	leaf := s.ca.Issue(s.t, testkit.Spec{ID: csr.URIs[0].String()})
	s.mu.Lock()
	s.md, s.fields, s.peer = md, fields, from
	s.mu.Unlock()
	return &securityv1.IstioCertificateResponse{CertChain: []string{string(pki.EncodeCertPEM(leaf.Cert)), s.ca.PEM()}}, nil
}

// meshctl csr sends the mission's rows from the command line: renewal by
// certificate (mTLS, no token), impersonation and a named signer, and prints the
// chain it got back.
func TestCSRSendsCertificateImpersonationAndSigner(t *testing.T) {
	root := testkit.NewCA(t, "root", nil, time.Now().Add(-time.Hour), 24*time.Hour)
	srvCert := root.Issue(t, testkit.Spec{Name: "istiod", IPs: []net.IP{net.ParseIP("127.0.0.1")}}).TLS()
	ca := &caStandIn{ca: root, t: t}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.RequestClientCert})))
	securityv1.RegisterIstioCertificateServiceServer(srv, ca)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rootFile := write("root.pem", []byte(root.PEM()))
	node := root.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/istio-system/sa/ztunnel"})
	keyPEM, err := pki.EncodeKeyPEM(node.Key, false)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := write("cert.pem", pki.EncodeCertPEM(node.Cert)), write("key.pem", keyPEM)

	var out strings.Builder
	err = Run(context.Background(), Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}, []string{"csr",
		"-dir", dir, "-ca-addr", lis.Addr().String(), "-ca-root-cert", rootFile, "-cert", certFile, "-key", keyFile,
		"-impersonate", "spiffe://cluster.local/ns/shop/sa/web", "-signer", "partner", "-id", "spiffe://cluster.local/ns/shop/sa/web"})
	if err != nil {
		t.Fatal(err)
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.peer != "spiffe://cluster.local/ns/istio-system/sa/ztunnel" || len(ca.md.Get("authorization")) != 0 {
		t.Errorf("client certificate %q, authorization %v: want the node's certificate and no token", ca.peer, ca.md.Get("authorization"))
	}
	if ca.fields["ImpersonatedIdentity"] != "spiffe://cluster.local/ns/shop/sa/web" || ca.fields["CertSigner"] != "partner" {
		t.Errorf("request metadata %v", ca.fields)
	}
	for _, want := range []string{"identity   spiffe://cluster.local/ns/shop/sa/web", "chain      2 certificates", "[1] root"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
