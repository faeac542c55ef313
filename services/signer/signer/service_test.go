package signer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/natsapi"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

const askedID = "spiffe://cluster.local/ns/kube-system/sa/admin" // what a greedy CSR asks for

// badInput is one bad request, sent over both transports.
type badInput struct {
	name     string
	csr      []byte
	token    string
	ttl      int64
	signer   string
	natsCode string
	grpcCode codes.Code
	wantMsg  string
	natsMsg  string // when the NATS reply words it differently
}

func badInputs(t *testing.T, e *env) []badInput {
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	good := e.token(t, "shop", "web")
	sa := e.iss.ServiceAccount("shop", "web", e.clock.Now().Add(-time.Second), time.Hour)
	with := func(f func(*tokentest.Claims)) string { c := sa; f(&c); return e.iss.Mint(t, c) }
	stranger := tokentest.NewIssuer(t, "meshagent-dev")

	b, _ := pem.Decode(csr)
	b.Bytes[len(b.Bytes)-5] ^= 0xff
	tampered := pem.EncodeToMemory(b)
	malformed := []byte("-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgY3Ny\n-----END CERTIFICATE REQUEST-----\n")
	huge := append(append([]byte{}, csr...), []byte(strings.Repeat("A", events.MaxEventSize+1))...)

	inv, unauth := events.CodeInvalidArgument, events.CodeUnauthenticated
	return []badInput{
		{"malformed PEM", malformed, good, 0, "", inv, codes.InvalidArgument, "csr", ""},
		{"CSR signature does not verify", tampered, good, 0, "", inv, codes.InvalidArgument, "signature", ""},
		{"expired token", csr, e.iss.Mint(t, e.iss.ServiceAccount("shop", "web", e.clock.Now().Add(-3*time.Hour), time.Hour)), 0, "", unauth, codes.Unauthenticated, "expired", ""},
		{"token for another audience", csr, with(func(c *tokentest.Claims) { c.Aud = []string{"vault"} }), 0, "", unauth, codes.Unauthenticated, "audience", ""},
		{"token from another issuer", csr, with(func(c *tokentest.Claims) { c.Iss = "https://evil.example" }), 0, "", unauth, codes.Unauthenticated, "issuer", ""},
		{"badly signed token", csr, tokentest.MintWith(t, stranger.Key, e.iss.KID, sa), 0, "", unauth, codes.Unauthenticated, "signature", ""},
		{"token signed by unknown key", csr, stranger.Mint(t, sa), 0, "", unauth, codes.Unauthenticated, "unknown key id", ""},
		{"token missing claims", csr, with(func(c *tokentest.Claims) { c.Exp = time.Time{} }), 0, "", unauth, codes.Unauthenticated, "exp", ""},
		{"token without service account", csr, with(func(c *tokentest.Claims) { c.NS, c.SA, c.Sub = "", "", "bob" }), 0, "", unauth, codes.Unauthenticated, "service account", ""},
		// Over NATS the event contract itself refuses a request without a credential.
		{"no credential", csr, "", 0, "", inv, codes.Unauthenticated, "credential", "a token or a cert_chain is required"},
		{"TTL above max", csr, good, int64((91 * 24 * time.Hour).Seconds()), "", inv, codes.InvalidArgument, "max allowed TTL", ""},
		// Seconds times time.Second would wrap negative and silently become the default
		// TTL: refused where the seconds become a Duration (decode, or Istio's request).
		{"TTL that overflows a duration", csr, good, math.MaxInt64/int64(time.Second) + 1, "", inv, codes.InvalidArgument, "more than a TTL can be", ""},
		{"largest TTL", csr, good, math.MaxInt64, "", inv, codes.InvalidArgument, "more than a TTL can be", ""},
		{"request over 64 KiB", huge, good, 0, "", events.CodeResourceExhausted, codes.ResourceExhausted, "", ""},
		{"unknown cert signer", csr, good, 0, "kubernetes.io/legacy-unknown", inv, codes.InvalidArgument, "unknown cert signer", ""},
	}
}

func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	e := newEnv(t)
	s := e.start(t, e.config("signer-a"))
	roots := bundle(t, e.nc).Roots
	client := istioClient(t, s, roots, nil, nil)
	rev := rootRevision(t, e.js)
	cases := badInputs(t, e)

	t.Run("nats", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				req := events.SignRequest{CSR: string(tc.csr), Token: tc.token, TTL: time.Duration(tc.ttl) * time.Second, CertSigner: tc.signer, Pod: events.PodRef{Namespace: "shop", Name: "web-0"}}
				var rep events.SignReply
				if tc.token == "" {
					// SignRequest.Validate refuses a request without a credential before it
					// is sent; send it anyway, raw, as a hostile client would.
					rep = natsRaw(t, e.nc, rawSign(t, `{"csr":"`+strings.ReplaceAll(string(tc.csr), "\n", `\n`)+`"}`))
				} else if tc.ttl > events.MaxTTLSeconds {
					// A Duration cannot hold it: send the seconds raw.
					rep = natsRaw(t, e.nc, rawSign(t, `{"csr":"`+strings.ReplaceAll(string(tc.csr), "\n", `\n`)+`","token":"`+tc.token+`","ttl_seconds":`+strconv.FormatInt(tc.ttl, 10)+`}`))
				} else if len(tc.csr) > events.MaxEventSize {
					rep = natsRaw(t, e.nc, rawSign(t, `{"csr":"`+strings.ReplaceAll(string(tc.csr), "\n", `\n`)+`","token":"`+tc.token+`"}`))
				} else {
					rep = natsSign(t, e.nc, req)
				}
				tc.checkNATS(t, rep)
			})
		}
	})
	// The same over the compact encoding, hand-made where the encoder refuses.
	t.Run("nats-compact", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				der := tc.csr
				if b, _ := pem.Decode(tc.csr); b != nil {
					der = b.Bytes
				}
				var rep events.SignReply
				switch {
				case tc.token == "":
					rep = natsRaw(t, e.nc, compactSign(compactField(1, der)))
				case tc.ttl > events.MaxTTLSeconds:
					rep = natsRaw(t, e.nc, compactSign(compactField(1, der), compactField(2, tc.token), compactField(5, uint64(tc.ttl))))
				case len(tc.csr) > events.MaxEventSize:
					rep = natsRaw(t, e.nc, compactSign(compactField(1, der), compactField(2, tc.token), compactField(50, tc.csr)))
				default:
					rep = natsSignIn(t, e.nc, events.EncodingCompact, "", events.SignRequest{CSR: string(tc.csr), Token: tc.token,
						TTL: time.Duration(tc.ttl) * time.Second, CertSigner: tc.signer, Pod: events.PodRef{Namespace: "shop", Name: "web-0"}})
				}
				tc.checkNATS(t, rep)
			})
		}
	})
	t.Run("grpc", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				resp, err := istioCreate(client, tc.token, tc.signer, tc.csr, tc.ttl)
				st, _ := status.FromError(err)
				if err == nil || st.Code() != tc.grpcCode || !strings.Contains(st.Message(), tc.wantMsg) || resp != nil {
					t.Fatalf("err %v, want %s %q", err, tc.grpcCode, tc.wantMsg)
				}
			})
		}
	})
	t.Run("garbled events", func(t *testing.T) {
		for name, msg := range map[string]*nats.Msg{
			"not a cloudevent":        {Subject: events.SubjectSignAny, Data: []byte(`{"csr":"x"}`)},
			"wrong type":              mustMsg(t, events.SubjectSignAny, events.BundleRequest{}),
			"not json":                rawSign(t, `csr=1`),
			"compact of another type": {Subject: events.SubjectSignAny, Data: []byte("\x00" + events.TypeBundleRequest + "\x00")},
			"compact, garbled":        compactSign([]byte{0x0a, 0x7f}),
		} {
			t.Run(name, func(t *testing.T) {
				if rep := natsRaw(t, e.nc, msg); rep.Error == nil || rep.Error.Code != events.CodeInvalidArgument {
					t.Fatalf("reply %+v", rep.Error)
				}
			})
		}
	})
	if n := count(t, e.js, events.SubjectCertIssued); n != 0 {
		t.Fatalf("%d cert.issued events after bad input only", n)
	}
	if got := rootRevision(t, e.js); got != rev {
		t.Fatalf("kv root revision %d -> %d after bad input", rev, got)
	}
	body := s.wantMetrics(t,
		`meshagent_signer_auth_failures_total{transport="nats"} 14`,
		`meshagent_signer_auth_failures_total{transport="grpc"} 8`,
		`meshagent_signer_csr_parse_failures_total{transport="grpc"} 2`,
	)
	if strings.Contains(body, "meshagent_signer_certs_issued_total") {
		t.Error("a certificate was counted as issued")
	}
}

// checkNATS checks a NATS reply to tc: refused with its code and message.
func (tc badInput) checkNATS(t *testing.T, rep events.SignReply) {
	t.Helper()
	msg := tc.wantMsg
	if tc.natsMsg != "" {
		msg = tc.natsMsg
	}
	if rep.Error == nil || rep.Error.Code != tc.natsCode || !strings.Contains(rep.Error.Message, msg) || len(rep.CertChain) != 0 {
		t.Fatalf("reply %+v, want %s %q", rep.Error, tc.natsCode, msg)
	}
}

func rawSign(t *testing.T, body string) *nats.Msg {
	m := mustMsg(t, events.SubjectSignAny, events.BundleRequest{})
	m.Header.Set(events.HeaderType, events.TypeSignRequest)
	m.Data = []byte(body)
	return m
}

func mustMsg(t *testing.T, subject string, p events.Payload) *nats.Msg {
	m, err := events.NewMsgOn(subject, "test", p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSignAndRenewOverBothTransports(t *testing.T) {
	e := newEnv(t)
	s := e.start(t, e.config("signer-a"))
	b := bundle(t, e.nc)
	if b.TrustDomain != "cluster.local" || len(b.Roots) != 1 || b.Generation != 1 {
		t.Fatalf("bundle %+v", b)
	}
	want := "spiffe://cluster.local/ns/shop/sa/web"

	// JWT over NATS: the identity comes from the token, not from the CSR.
	key, csr := signertest.CSR(t, pki.ECP256, askedID)
	rep := natsSignAs(t, e.nc, "web-0", events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), TTL: time.Hour, Pod: events.PodRef{Namespace: "shop", Name: "web-0"}, Resource: "default", KeyAlgorithm: "EC-P256"})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	leaf := verifyChain(t, rep.CertChain, rep.Roots, time.Now())
	if len(rep.CertChain) != 2 || len(leaf.URIs) != 1 || leaf.URIs[0].String() != want || len(leaf.DNSNames) != 0 {
		t.Fatalf("leaf SANs %v, chain %d", leaf.URIs, len(rep.CertChain))
	}
	if leaf.NotAfter.Sub(leaf.NotBefore) != time.Hour+ca.Backdate {
		t.Fatalf("ttl %s", leaf.NotAfter.Sub(leaf.NotBefore))
	}
	ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued)
	rootFP := pki.Fingerprint(mustCerts(t, b.Roots)[0])
	if ev.Serial != pki.SerialHex(leaf) || ev.SPIFFEID != want || ev.Pod != shopPod("web-0") || ev.Resource != "default" || ev.KeyAlgorithm != "EC-P256" ||
		ev.AuthSource != "jwt" || ev.Signer != "signer-a" || ev.Transport != "nats" || ev.RootFingerprint != rootFP || !ev.NotAfter.Equal(leaf.NotAfter) {
		t.Fatalf("cert.issued %+v", ev)
	}

	// Renewal over NATS with the still-valid cert and a proof over the new CSR.
	_, csr2 := signertest.CSR(t, pki.RSA2048, askedID)
	rep2 := natsSignAs(t, e.nc, "web-0", events.SignRequest{CSR: string(csr2), CertChain: rep.CertChain, Proof: proof(t, key, csr2), Pod: events.PodRef{Namespace: "shop", Name: "web-0"}})
	if rep2.Error != nil {
		t.Fatal(rep2.Error)
	}
	leaf2 := verifyChain(t, rep2.CertChain, rep2.Roots, time.Now())
	if leaf2.URIs[0].String() != want || leaf2.NotAfter.Sub(leaf2.NotBefore) != 24*time.Hour+ca.Backdate {
		t.Fatalf("renewed leaf %v ttl %s", leaf2.URIs, leaf2.NotAfter.Sub(leaf2.NotBefore))
	}
	if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); ev.AuthSource != "x509" || ev.KeyAlgorithm != "RSA-2048" {
		t.Fatalf("renewal event %+v", ev)
	}
	// A proof made with another key does not renew.
	other, _ := pki.GenerateKey(pki.ECP256)
	if rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr2), CertChain: rep.CertChain, Proof: proof(t, other, csr2)}); rep.Error == nil || rep.Error.Code != events.CodeUnauthenticated {
		t.Fatalf("foreign proof: %+v", rep.Error)
	}

	// JWT over gRPC, as an Istio agent calls it.
	client := istioClient(t, s, b.Roots, nil, nil)
	_, csr3 := signertest.CSR(t, pki.ECP256, askedID)
	resp, err := istioCreate(client, e.token(t, "shop", "web"), "", csr3, 600)
	if err != nil {
		t.Fatal(err)
	}
	leaf3 := verifyChain(t, resp.CertChain, b.Roots, time.Now())
	if leaf3.URIs[0].String() != want || leaf3.NotAfter.Sub(leaf3.NotBefore) != 10*time.Minute+ca.Backdate {
		t.Fatalf("grpc leaf %v", leaf3.URIs)
	}
	if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); ev.Transport != "grpc" || !ev.Pod.IsZero() || ev.AuthSource != "jwt" {
		t.Fatalf("grpc event %+v", ev)
	}

	// Renewal over gRPC: mTLS with the still-valid cert, no token.
	tlsCert := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}
	mtls := istioClient(t, s, b.Roots, &tlsCert, nil)
	_, csr4 := signertest.CSR(t, pki.ECP256, askedID)
	resp, err = istioCreate(mtls, "", "", csr4, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l := verifyChain(t, resp.CertChain, b.Roots, time.Now()); l.URIs[0].String() != want {
		t.Fatalf("mtls renewal leaf %v", l.URIs)
	}
	if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); ev.AuthSource != "x509" || ev.Transport != "grpc" {
		t.Fatalf("mtls event %+v", ev)
	}
	if n := count(t, e.js, events.SubjectCertIssued); n != 4 {
		t.Fatalf("%d cert.issued events, want 4", n)
	}

	// Health and metrics.
	if code, body := testkit.HTTPGet("http://" + s.http.Addr().String() + "/readyz"); code != 200 {
		t.Fatalf("readyz %d: %s", code, body)
	}
	s.wantMetrics(t,
		`meshagent_signer_certs_issued_total{transport="nats"} 2`,
		`meshagent_signer_certs_issued_total{transport="grpc"} 2`,
		`meshagent_signer_csr_received_total{transport="nats"} 3`,
		"meshagent_signer_root_expiry_seconds 3.15",
	)
}

func mustCerts(t *testing.T, pems []string) []*x509.Certificate {
	t.Helper()
	cs, err := pki.ParseCertPEMs(pems)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestNATSOnlyBadInput(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.config("signer-a"))
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	weak, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	weakCSR, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, weak)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  events.SignRequest
		code string
		msg  string
	}{
		{"key_algorithm does not match the CSR", events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), KeyAlgorithm: "RSA-2048"}, events.CodeInvalidArgument, "does not match"},
		{"weak CSR key", events.SignRequest{CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: weakCSR})), Token: e.token(t, "shop", "web")}, events.CodeInvalidArgument, "not allowed"},
		{"renewal cert that is not ours", events.SignRequest{CSR: string(csr), CertChain: []string{string(pki.EncodeCertPEM(testkit.NewCA(t, "x", nil, time.Now(), time.Hour).Cert))}, Proof: "AAAA"}, events.CodeUnauthenticated, "client certificate"},
		{"resource that is not CA-issued", events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), Resource: "ROOTCA"}, events.CodeInvalidArgument, "resource"},
		{"renewal proof not base64", events.SignRequest{CSR: string(csr), CertChain: []string{"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}, Proof: "!"}, events.CodeUnauthenticated, "cert_chain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := natsSign(t, e.nc, tc.req)
			if rep.Error == nil || rep.Error.Code != tc.code || !strings.Contains(rep.Error.Message, tc.msg) {
				t.Fatalf("reply %+v, want %s %q", rep.Error, tc.code, tc.msg)
			}
		})
	}
	if n := count(t, e.js, events.SubjectCertIssued); n != 0 {
		t.Fatalf("%d cert.issued events", n)
	}
}

// An Istio agent on the same host can reach the signer over a unix socket; TLS and
// the server name are the same as over TCP.
func TestGRPCOverUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "ma")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	e := newEnv(t)
	c := e.config("signer-u")
	c.Listen.GRPC = "unix://" + filepath.Join(dir, "ca.sock")
	s := e.start(t, c)
	roots := bundle(t, e.nc).Roots
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	resp, err := istioCreate(istioClient(t, s, roots, nil, nil), e.token(t, "shop", "web"), "", csr, 0)
	if err != nil {
		t.Fatal(err)
	}
	if leaf := verifyChain(t, resp.CertChain, roots, time.Now()); leaf.URIs[0].String() != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Fatalf("leaf %v", leaf.URIs)
	}
}

func TestGRPCRejectsMalformedAuthorization(t *testing.T) {
	e := newEnv(t)
	s := e.start(t, e.config("signer-a"))
	client := istioClient(t, s, bundle(t, e.nc).Roots, nil, nil)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	for _, h := range []string{"Basic dXNlcjpwYXNz", "Bearer", "Bearer    ", e.token(t, "shop", "web")} {
		t.Run(h[:min(len(h), 12)], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", h)
			_, err := client.CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: string(csr)})
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("err %v, want Unauthenticated", err)
			}
		})
	}
	if n := count(t, e.js, events.SubjectCertIssued); n != 0 {
		t.Fatalf("%d cert.issued events", n)
	}
}

// New only builds: nothing listens and nothing subscribes on the bus until Run.
func TestNewStartsNothing(t *testing.T) {
	e := newEnv(t)
	subs := e.srv.NumSubscriptions()
	s := e.build(t, e.config("signer-a"), nil)
	if s.GRPCAddr() != nil {
		t.Fatalf("gRPC bound at %s before Run", s.GRPCAddr())
	}
	if got := e.srv.NumSubscriptions(); got != subs {
		t.Fatalf("%d bus subscriptions before Run, want %d", got, subs)
	}
	if s.ready() == nil {
		t.Fatal("ready before Run")
	}
}

// Ctrl-C while the signer is still starting (here: before the event stream is even
// looked up) is an orderly exit, not a failure.
func TestRunReturnsNilWhenCancelledDuringStartup(t *testing.T) {
	e := newEnv(t)
	s := e.build(t, e.config("signer-a"), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run after cancel during startup: %v", err)
	}
	if s.ready() == nil {
		t.Fatal("ready after an interrupted startup")
	}
}

// A real startup failure is still reported as one.
func TestRunReportsStartupFailure(t *testing.T) {
	e := newEnv(t)
	c := e.config("signer-a")
	c.Auth.JWKSFile = filepath.Join(t.TempDir(), "missing.json")
	s := e.build(t, c, nil)
	if err := s.Run(context.Background()); err == nil {
		t.Fatal("Run with a missing JWKS file returned nil")
	}
}

// oneWorkerSigner is a signer with one NATS worker, and a CSR for askedID.
func oneWorkerSigner(t *testing.T) (*env, *replica, []byte) {
	e := newEnv(t)
	c := e.config("signer-a")
	c.Workers = 1
	s := e.start(t, c)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	return e, s, csr
}

// A burst as a wave of pods sends it — every request at once, each carrying its
// requester's deadline as sds-edge's do — is held and answered, not dropped:
// PendingPerWorker requests per worker may wait. (With 4 per worker, a storm's
// bursts were dropped and each of their pods waited out its whole timeout.)
func TestNATSBurstIsHeldNotDropped(t *testing.T) {
	e, s, csr := oneWorkerSigner(t)
	token := e.token(t, "shop", "web")
	inbox := nats.NewInbox()
	replies, err := e.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	const burst = 64 // one worker: PendingPerWorker (64) waiting, one in hand
	deadline := time.Now().Add(time.Minute)
	for range burst {
		msg, err := events.NewSignRequestMsg(events.SubjectSignAny, events.EncodingCompact, "test", events.SignRequest{CSR: string(csr), Token: token, Deadline: deadline})
		if err != nil {
			t.Fatal(err)
		}
		msg.Reply = inbox
		if err := e.nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	signed := 0
	for i := range burst {
		m, err := replies.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d requests answered: %v", i, burst, err)
		}
		if rep, _, err := events.DecodeSignReply(m); err == nil && rep.Error == nil && len(rep.CertChain) > 0 {
			signed++
		}
	}
	if signed != burst {
		t.Fatalf("%d of %d requests signed", signed, burst)
	}
	if body := s.metrics(t); !strings.Contains(body, "meshagent_signer_nats_requests_dropped_total 0") {
		t.Fatalf("requests dropped in a burst of %d:\n%s", burst, body)
	}
}

// TestNATSStormIsTurnedAwayWithSlots: a storm larger than the workers' queue is
// answered, not dropped: what the waiting room does not queue gets at once a busy
// refusal with a retry-after, each request its own slot, so that the crowd comes
// back spread; nothing waits in silence for its timeout, and the signer does not
// queue minutes of work. A request whose reply subject is no requester's inbox
// gets nothing, turned away or not. (Before the room, NATS dropped what did not fit
// in the queue: those requests got no answer at all, which this test fails on.)
func TestNATSStormIsTurnedAwayWithSlots(t *testing.T) {
	e, s, _ := oneWorkerSigner(t)
	token := e.token(t, "shop", "web")
	storm := bustest.Conn(t, e.srv)
	inbox := nats.NewInbox()
	replies, err := storm.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := replies.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	// A subject a reflected answer would land on; the signer's own connection may
	// publish there, a requester's reply subject must not send it anything.
	const reflect = "meshagent.test.reflected"
	reflected, err := e.nc.SubscribeSync(reflect)
	if err != nil {
		t.Fatal(err)
	}
	const n, hostile = 2000, 100
	deadline := time.Now().Add(time.Minute)
	for i := range n {
		_, csr := signertest.CSR(t, pki.ECP256, askedID)
		msg, err := events.NewSignRequestMsg(events.SubjectSignAny, events.EncodingCompact, "test", events.SignRequest{CSR: string(csr), Token: token, Deadline: deadline})
		if err != nil {
			t.Fatal(err)
		}
		msg.Reply = inbox
		if i%(n/hostile) == n/hostile-1 {
			msg.Reply = reflect
		}
		if err := storm.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := storm.Flush(); err != nil {
		t.Fatal(err)
	}
	signed, turned := 0, 0
	var firstRecv, lastRecv, firstDue, lastDue time.Time
	for got := 0; got < n-hostile; got++ {
		m, err := replies.NextMsg(60 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d requests answered (%d signed, %d turned away): %v", got, n-hostile, signed, turned, err)
		}
		rep, _, err := events.DecodeSignReply(m)
		switch {
		case err != nil:
			t.Fatal(err)
		case rep.Error == nil:
			signed++
		case rep.Error.Code == events.CodeUnavailable && rep.Error.RetryAfter() == 0:
			// Signed, but its record not stored in time (a loaded machine's
			// JetStream): answered all the same, and not a slot.
			signed++
		case rep.Error.Code == events.CodeUnavailable && rep.Error.RetryAfter() > 0:
			now := time.Now()
			due := now.Add(rep.Error.RetryAfter())
			if turned == 0 {
				firstRecv, firstDue, lastDue = now, due, due
			}
			lastRecv = now
			if due.Before(firstDue) {
				firstDue = due
			}
			if due.After(lastDue) {
				lastDue = due
			}
			turned++
		default:
			t.Fatalf("request refused: %v", rep.Error)
		}
	}
	if turned == 0 || signed == 0 {
		t.Fatalf("%d signed and %d turned away: want both (one worker, a queue of %d)", signed, turned, natsapi.PendingPerWorker)
	}
	// Slots are one request's time apart at the workers' pace (one worker: well
	// under 4,000 a second), so the times the crowd is told to come back at spread
	// further than the refusals' own arrival did by at least 250 µs a refusal. A
	// control: one retry-after for all would spread them no more than they came.
	if spread, came := lastDue.Sub(firstDue), lastRecv.Sub(firstRecv); spread-came < time.Duration(turned)*250*time.Microsecond {
		t.Fatalf("%d refusals told to come back over %s, having come over %s: the crowd is not spread", turned, spread, came)
	}
	if m, err := reflected.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("an answer was sent to a reply subject that is no inbox: %q", m.Data)
	}
	body := s.metrics(t)
	for _, want := range []string{"meshagent_signer_nats_requests_dropped_total 0", "meshagent_signer_nats_slow_consumer_events_total 0",
		fmt.Sprintf("meshagent_signer_nats_requests_turned_away_total %d", turned)} {
		if !strings.Contains(body, want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
	if !strings.Contains(body, "meshagent_signer_nats_replies_refused_total") || strings.Contains(body, "meshagent_signer_nats_replies_refused_total 0\n") {
		t.Fatalf("the %d requests answering elsewhere were not refused:\n%s", hostile, body)
	}
}

// TestALostAnswerIsRepeatedNotReissued: a requester that stopped waiting just as
// its certificate was signed (its answer sent to nobody) asks again with the same
// CSR and gets that certificate, already recorded: one cert.issued, one
// certificate, whatever the number of answers lost. Over the real bus and
// JetStream.
func TestALostAnswerIsRepeatedNotReissued(t *testing.T) {
	e, s, csr := oneWorkerSigner(t)
	req := events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")}
	lost, err := events.NewMsgOn(events.SubjectSignAny, "test", req)
	if err != nil {
		t.Fatal(err)
	}
	lost.Reply = nats.NewInbox() // nobody listens: the answer is lost
	if err := e.nc.PublishMsg(lost); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyWithin(t, 30*time.Second, "the lost answer's certificate recorded", func() bool {
		return count(t, e.js, events.SubjectCertIssued) == 1
	})
	recorded := last[events.CertIssued](t, e.js, events.SubjectCertIssued)
	for range 3 {
		rep := natsSign(t, e.nc, req)
		if rep.Error != nil {
			t.Fatal(rep.Error)
		}
		leaf := mustCerts(t, rep.CertChain)[0]
		if got := pki.SerialHex(leaf); got != recorded.Serial {
			t.Fatalf("the repeat was answered with %s, want the recorded %s", got, recorded.Serial)
		}
	}
	if n := count(t, e.js, events.SubjectCertIssued); n != 1 {
		t.Fatalf("%d cert.issued after three repeats, want the one", n)
	}
	body := s.metrics(t)
	for _, want := range []string{`meshagent_signer_certs_issued_total{transport="nats"} 1`, `meshagent_signer_requests_repeated_total{transport="nats"} 3`} {
		if !strings.Contains(body, want) {
			t.Fatalf("metrics lack %s:\n%s", want, body)
		}
	}

	// Another key is another certificate.
	_, other := signertest.CSR(t, pki.ECP256, askedID)
	if rep := natsSign(t, e.nc, events.SignRequest{CSR: string(other), Token: req.Token}); rep.Error != nil || pki.SerialHex(mustCerts(t, rep.CertChain)[0]) == recorded.Serial {
		t.Fatalf("a new CSR: %v, or answered with the recorded certificate", rep.Error)
	}
}
