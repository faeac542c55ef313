package signer

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
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
	iss   *tokentest.Issuer
	jwks  string
	kek   string      // -ca-kek-file shared by the env's replicas
	clock clock.Clock // the replicas' time: the real clock unless a test moves a fake one
}

func newEnv(t *testing.T) *env {
	e := newEnvOn(t, bustest.Server(t))
	e.js = bustest.JetStream(t, e.nc)
	return e
}

// newEnvOn is an env on the bus server s, whose JetStream may not be up yet.
func newEnvOn(t *testing.T, s *server.Server) *env {
	nc := bustest.Conn(t, s)
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	return &env{srv: s, nc: nc, iss: iss, jwks: iss.WriteJWKS(t, t.TempDir()), kek: signertest.KEKFile(t), clock: clock.Real{}}
}

func (e *env) config(instance string) config.Config {
	c := config.Default()
	c.Instance = instance
	c.Listen.HTTP = "127.0.0.1:0"
	c.Listen.GRPC = "127.0.0.1:0"
	c.Auth.JWKSFile = e.jwks
	c.CA.KEKFile = e.kek
	c.Workers = 8
	// These tests sign for one identity many times a minute on purpose; the
	// bound is tested on its own (TestPodThatKeepsAskingIsToldWhy).
	c.Certs.MaxEarlyPerMinute = 0
	return c
}

// replica is a signer with the health and metrics server that lifecycle.Serve
// gives it in a process.
type replica struct {
	*Signer
	http *obs.Server
}

// build builds a replica as a process does, on a connection of its own, logging to
// log (nil: nowhere). Nothing runs yet.
func (e *env) build(t testing.TB, cfg config.Config, log hclog.Logger) *replica {
	t.Helper()
	if log == nil {
		log = hclog.NewNullLogger()
	}
	http := obs.NewServer(cfg.Listen.HTTP, log.Named("http"))
	s, err := New(cfg, lifecycle.Deps{Bus: bustest.Conn(t, e.srv), Clock: e.clock, Log: log, Metrics: http.Registry(), Health: http})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{Signer: s, http: http}
}

// ready is what /readyz says: nil once the CA is loaded, NATS subscribed and gRPC bound.
func (r *replica) ready() error { return r.http.Ready() }

// metrics scrapes the replica's /metrics.
func (r *replica) metrics(t *testing.T) string {
	t.Helper()
	code, body := testkit.HTTPGet("http://" + r.http.Addr().String() + "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	return body
}

// wantMetrics scrapes the replica's /metrics, fails t for each of lines that is not
// in it, and returns the scrape.
func (r *replica) wantMetrics(t *testing.T, lines ...string) string {
	t.Helper()
	body := r.metrics(t)
	for _, want := range lines {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	return body
}

// pluggedCADir writes an Istio cacerts directory (-cacerts-dir) holding an
// intermediate CA under a root, both valid from now.
func pluggedCADir(t *testing.T, now time.Time) (root, inter *testkit.CA, dir string) {
	t.Helper()
	root = testkit.NewCA(t, "root", nil, now, 48*time.Hour)
	inter = testkit.NewCA(t, "inter", root, now, 24*time.Hour)
	dir = t.TempDir()
	signertest.WriteCACerts(t, dir, inter, []*x509.Certificate{root.Cert}, root.Cert)
	return root, inter, dir
}

// run runs the replica and its health server until the test ends, and checks that
// they stop cleanly.
func (r *replica) run(t *testing.T) (done chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- lifecycle.Tasks(ctx, r.http.Run, r.Run) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("signer %s: %v", r.cfg.Instance, err)
			}
		case <-time.After(testkit.Timeout):
			t.Errorf("signer %s did not stop", r.cfg.Instance)
		}
	})
	return errc
}

// start runs a signer until the test ends and waits until it is ready.
func (e *env) start(t *testing.T, cfg config.Config) *replica {
	t.Helper()
	r := e.build(t, cfg, nil)
	done := r.run(t)
	testkit.EventuallyWithin(t, 20*time.Second, "signer ready", func() bool {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("signer exited: %v", err)
		default:
		}
		return r.ready() == nil && r.http.Addr() != nil
	})
	return r
}

func (e *env) token(t *testing.T, ns, sa string) string {
	return e.iss.Mint(t, e.iss.ServiceAccount(ns, sa, e.clock.Now().Add(-time.Second), time.Hour))
}

// natsSign sends req over NATS (a CloudEvent) and decodes the reply.
func natsSign(t *testing.T, nc *nats.Conn, req events.SignRequest) events.SignReply {
	t.Helper()
	return natsSignAs(t, nc, "", req)
}

// natsSignAs sends req on busPod's sign subject (SubjectSignAny when busPod is "").
func natsSignAs(t *testing.T, nc *nats.Conn, busPod string, req events.SignRequest) events.SignReply {
	t.Helper()
	return natsSignIn(t, nc, events.EncodingCompact, busPod, req)
}

// natsSignIn is natsSignAs in encoding enc.
func natsSignIn(t *testing.T, nc *nats.Conn, enc events.Encoding, busPod string, req events.SignRequest) events.SignReply {
	t.Helper()
	subject := events.SubjectSignAny
	if busPod != "" {
		var err error
		if subject, err = events.PodSignSubject(shopPod(busPod)); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := events.NewSignRequestMsg(subject, enc, "test", req)
	if err != nil {
		t.Fatal(err)
	}
	return natsRaw(t, nc, msg)
}

// natsRaw sends msg and decodes the reply, which must come in the request's
// encoding.
func natsRaw(t *testing.T, nc *nats.Conn, msg *nats.Msg) events.SignReply {
	t.Helper()
	resp, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rep, enc, err := events.DecodeSignReply(resp)
	if err != nil {
		t.Fatal(err)
	}
	// The sign subjects' one encoding: a reply is compact, whatever came.
	if enc != events.EncodingCompact {
		t.Fatalf("a %s reply on a sign subject", enc)
	}
	return rep
}

// compactSign is a hand-made compact sign request on SubjectSignAny: the type,
// then fields as given (protobuf wire format), for requests the encoder refuses.
func compactSign(fields ...[]byte) *nats.Msg {
	b := []byte("\x00" + events.TypeSignRequest + "\x00")
	for _, f := range fields {
		b = append(b, f...)
	}
	return &nats.Msg{Subject: events.SubjectSignAny, Data: b}
}

// compactField is field num: bytes when v is a string or []byte, else a varint.
func compactField(num uint64, v any) []byte {
	switch v := v.(type) {
	case string:
		return compactField(num, []byte(v))
	case []byte:
		b := binary.AppendUvarint(binary.AppendUvarint(nil, num<<3|2), uint64(len(v)))
		return append(b, v...)
	case uint64:
		return binary.AppendUvarint(binary.AppendUvarint(nil, num<<3), v)
	}
	panic("compactField: " + fmt.Sprint(v))
}

func natsCall[Req events.Payload, Rep events.Payload](t *testing.T, nc *nats.Conn, subject string, req Req) Rep {
	t.Helper()
	msg, err := events.NewMsgOn(subject, "test", req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := events.DecodeReply[Rep](resp)
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
func istioClient(t *testing.T, s *replica, roots []string, clientCert *tls.Certificate, now func() time.Time) pb.IstioCertificateServiceClient {
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
	return istioCreateOpts(c, token, certSigner, csr, ttl)
}

// istioCreateOpts is istioCreate with call options (grpc.Header to read the reply's headers).
func istioCreateOpts(c pb.IstioCertificateServiceClient, token, certSigner string, csr []byte, ttl int64, opts ...grpc.CallOption) (*pb.IstioCertificateResponse, error) {
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
	return c.CreateCertificate(ctx, req, opts...)
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

// shopPod is a test pod: "<namespace>/<name>", or a bare name in namespace shop,
// where the tests' pods are.
func shopPod(s string) events.PodRef {
	if !strings.Contains(s, "/") {
		s = "shop/" + s
	}
	var p events.PodRef
	_ = p.UnmarshalText([]byte(s))
	return p
}

// optPod is shopPod, and the zero PodRef for "".
func optPod(s string) events.PodRef {
	if s == "" {
		return events.PodRef{}
	}
	return shopPod(s)
}
