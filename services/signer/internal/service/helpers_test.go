package service

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"
)

// ServerName is the name a client verifies the signer's gRPC certificate against.
const serverName = "istiod.istio-system.svc"

type env struct {
	srv   *server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	iss   *testkit.Issuer
	jwks  string
	kek   string // -ca-kek-file shared by the env's replicas
	clock func() time.Time
}

func newEnv(t *testing.T) *env {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	iss := testkit.NewIssuer(t, "meshagent-dev")
	return &env{srv: s, nc: nc, js: bustest.JetStream(t, nc), iss: iss, jwks: iss.WriteJWKS(t, t.TempDir()), kek: testkit.KEKFile(t), clock: time.Now}
}

func (e *env) config(instance string) config.Config {
	c := config.Default()
	c.Instance = instance
	c.Listen.HTTP = "127.0.0.1:0"
	c.Listen.GRPC = "127.0.0.1:0"
	c.Auth.JWKSFile = e.jwks
	c.CA.KEKFile = e.kek
	c.Workers = 8
	return c
}

// start runs a signer until the test ends and waits until it is ready.
func (e *env) start(t *testing.T, cfg config.Config) *Service {
	t.Helper()
	nc := bustest.Conn(t, e.srv) // a connection per replica, as separate processes have
	s, err := New(cfg, nc, hclog.NewNullLogger(), e.clock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("signer %s: %v", cfg.Instance, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("signer %s did not stop", cfg.Instance)
		}
	})
	testkit.Eventually(t, 20*time.Second, "signer ready", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("signer exited: %v", err)
		default:
		}
		return s.Ready() == nil
	})
	return s
}

func (e *env) token(t *testing.T, ns, sa string) string {
	return e.iss.Mint(t, e.iss.ServiceAccount(ns, sa, e.clock().Add(-time.Second), time.Hour))
}

// natsSign sends req over NATS and decodes the reply.
func natsSign(t *testing.T, nc *nats.Conn, req events.SignRequest) events.SignReply {
	t.Helper()
	return natsSignAs(t, nc, "", req)
}

// natsSignAs sends req on busPod's sign subject (SubjectSignAny when busPod is "").
func natsSignAs(t *testing.T, nc *nats.Conn, busPod string, req events.SignRequest) events.SignReply {
	t.Helper()
	subject := events.SubjectSignAny
	if busPod != "" {
		var err error
		if subject, err = events.PodSignSubject(busPod); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := events.NewMsg(subject, "test", req)
	if err != nil {
		t.Fatal(err)
	}
	return natsRaw(t, nc, msg)
}

func natsRaw(t *testing.T, nc *nats.Conn, msg *nats.Msg) events.SignReply {
	t.Helper()
	resp, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rep, _, err := events.Decode[events.SignReply](resp)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func natsCall[Req events.Payload, Rep events.Payload](t *testing.T, nc *nats.Conn, subject string, req Req) Rep {
	t.Helper()
	msg, err := events.NewMsg(subject, "test", req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rep, _, err := events.Decode[Rep](resp)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// bundle asks the signers for the trust bundle.
func bundle(t *testing.T, nc *nats.Conn) events.BundleReply {
	t.Helper()
	rep := natsCall[events.BundleRequest, events.BundleReply](t, nc, events.SubjectTrustBundle, events.BundleRequest{})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	return rep
}

// istioClient dials the signer the way an Istio agent does: TLS, trusting the
// signer's roots, server name istiod.istio-system.svc; optionally with a client cert.
func istioClient(t *testing.T, s *Service, roots []string, clientCert *tls.Certificate, now func() time.Time) pb.IstioCertificateServiceClient {
	t.Helper()
	certs, err := pki.ParseCertPEMs(roots)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	tc := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12, Time: now}
	if clientCert != nil {
		tc.Certificates = []tls.Certificate{*clientCert}
	}
	target := "passthrough:///" + s.GRPCAddr().String()
	if s.GRPCAddr().Network() == "unix" {
		target = "unix://" + s.GRPCAddr().String()
	}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return pb.NewIstioCertificateServiceClient(cc)
}

// istioCreate calls CreateCertificate with Istio agent metadata.
func istioCreate(c pb.IstioCertificateServiceClient, token, certSigner string, csr []byte, ttl int64) (*pb.IstioCertificateResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md := metadata.Pairs("ClusterID", "Kubernetes")
	if token != "" {
		md.Set("authorization", "Bearer "+token)
	}
	ctx = metadata.NewOutgoingContext(ctx, md)
	req := &pb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: ttl}
	if certSigner != "" {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{"CertSigner": structpb.NewStringValue(certSigner)}}
	}
	return c.CreateCertificate(ctx, req)
}

// verifyChain checks that chain (leaf first, root last) verifies to a root in roots
// and returns the leaf.
func verifyChain(t *testing.T, chain, roots []string, at time.Time) *x509.Certificate {
	t.Helper()
	if len(chain) < 2 {
		t.Fatalf("chain has %d PEMs, want at least 2", len(chain))
	}
	certs, err := pki.ParseCertPEMs(chain)
	if err != nil {
		t.Fatal(err)
	}
	rootCerts, err := pki.ParseCertPEMs(roots)
	if err != nil {
		t.Fatal(err)
	}
	last := certs[len(certs)-1]
	found := false
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range rootCerts {
		pool.AddCert(r)
		found = found || r.Equal(last)
	}
	if !found || !last.IsCA {
		t.Fatal("chain does not end with a root of the bundle")
	}
	for _, c := range certs[1 : len(certs)-1] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify: %v", err)
	}
	return certs[0]
}

// count returns how many messages the event stream holds on subject.
func count(t *testing.T, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// last decodes the newest event on subject.
func last[T events.Payload](t *testing.T, js jetstream.JetStream, subject string) T {
	t.Helper()
	st, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetLastMsgForSubject(context.Background(), subject)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := events.Decode[T](&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func rootRevision(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), "meshagent-ca")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), "root")
	if err != nil {
		t.Fatal(err)
	}
	return e.Revision()
}

func proof(t *testing.T, key crypto.Signer, csrPEM []byte) string {
	t.Helper()
	csr, err := pki.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := pki.SignProof(key, csr.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(sig)
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
