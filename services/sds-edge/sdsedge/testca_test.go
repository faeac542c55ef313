package sdsedge_test

import (
	"context"
	"crypto"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/tests/testkit"
)

// testCA is a faithful stand-in for the signer: a real CA that authenticates the
// caller by an HMAC-signed JWT with Kubernetes service-account claims (or a
// still-valid leaf plus a proof), takes the identity from the credential, never from
// the CSR, and answers events.SignWildcard over NATS and Istio's CreateCertificate
// over gRPC with TLS. Like the signer, it endorses every bundle it hands out (in
// sign and bundle replies and trust.changed) with its current key and, after a
// new-key rotation, the previous one, which is the key pods trust already.
type testCA struct {
	td     string
	secret []byte

	mu    sync.Mutex
	roots []*x509.Certificate // newest first
	keys  []crypto.Signer
	gen   uint64
	// federated are the foreign domains a bundle request with Federation is told of.
	federated []string

	failNext  atomic.Int32 // answer this many requests with "unavailable"
	requests  atomic.Int32
	inFlight  atomic.Int32
	maxFlight atomic.Int32
	delay     time.Duration
	lastReq   atomic.Pointer[events.SignRequest]
	lastMD    atomic.Pointer[metadata.MD]
	rogueID   atomic.Pointer[string] // when set, sign for this identity instead (a rogue responder)
	silent    atomic.Bool            // when set, sign requests get no answer (a rogue answers alone)
	certAuth  atomic.Int32           // gRPC requests authenticated by a client certificate
	// phased, when set, is who signs and what follows the leaf in a reply: a phase
	// of a rotation to a new key, as the signer replies in it (testkit.Rotation).
	phased atomic.Pointer[phasedChain]
	// named, when set, is a named signer with a CA of its own (named_signer_test.go).
	named atomic.Pointer[namedSigner]
	// lastSigner is the CertSigner of the last gRPC request's metadata.
	lastSigner atomic.Pointer[string]
	// bundleHeader, when set, is sent as the trust bundle header of gRPC replies
	// (events.TrustBundleHeader), as the signer sends its bundle; unset: none, as istiod.
	bundleHeader atomic.Pointer[string]
}

type phasedChain struct {
	signer *testkit.CA
	above  []*x509.Certificate
}

// setPhase makes the CA sign and reply as the signer does in phase of rot.
func (c *testCA) setPhase(rot *testkit.Rotation, phase int) {
	c.phased.Store(&phasedChain{signer: rot.Signer(phase), above: rot.Above(phase)})
}

func newTestCA(tb testing.TB) *testCA {
	c := &testCA{td: "cluster.local", secret: []byte("test-jwt-secret")}
	c.rotate(tb)
	return c
}

// rotate adds a new root with a new key; the bundle keeps the old ones (newest first).
func (c *testCA) rotate(tb testing.TB) *x509.Certificate {
	return c.add(testkit.NewCA(tb, rootName(), nil, time.Now().Add(-time.Hour), 10*24*time.Hour))
}

// rotateSameKey adds a new root certificate for the current key.
func (c *testCA) rotateSameKey(tb testing.TB) *x509.Certificate {
	c.mu.Lock()
	k := c.keys[0]
	c.mu.Unlock()
	return c.add(testkit.SelfSigned(tb, testkit.Spec{Name: rootName(), IsCA: true, Key: k, Life: 10 * 24 * time.Hour}).CA())
}

func rootName() string { return fmt.Sprintf("root %d", time.Now().UnixNano()) }

// add makes root the newest root, a generation after the last.
func (c *testCA) add(root *testkit.CA) *x509.Certificate {
	c.mu.Lock()
	c.roots = append([]*x509.Certificate{root.Cert}, c.roots...)
	c.keys = append([]crypto.Signer{root.Key}, c.keys...)
	c.gen++
	c.mu.Unlock()
	return root.Cert
}

func (c *testCA) bundle() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return pki.CertPEMs(c.roots)
}

// current returns the bundle, its generation and its endorsements.
func (c *testCA) current(tb testing.TB) ([]string, uint64, []events.Endorsement) {
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	roots := c.bundle()
	return roots, gen, c.endorse(tb, gen, roots)
}

// endorse signs (td, gen, roots) with the current key and the previous one.
func (c *testCA) endorse(tb testing.TB, gen uint64, roots []string) []events.Endorsement {
	c.mu.Lock()
	keys := c.keys[:min(2, len(c.keys))]
	c.mu.Unlock()
	return endorseWith(tb, c.td, gen, roots, keys...)
}

// endorseWith signs (td, gen, roots) with each key.
func endorseWith(tb testing.TB, td string, gen uint64, roots []string, keys ...crypto.Signer) []events.Endorsement {
	out, err := trustbundle.Endorse(td, gen, roots, keys...)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// trustChanged is the endorsed trust.changed of roots at gen.
func (c *testCA) trustChanged(tb testing.TB, gen uint64, roots []string, removed ...string) events.TrustChanged {
	return events.TrustChanged{TrustDomain: c.td, Roots: roots, Removed: removed, Reason: events.TrustReasonRotation,
		Generation: gen, Endorsements: c.endorse(tb, gen, roots)}
}

func serial() *big.Int { n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120)); return n }

// token mints a Kubernetes-style service-account JWT.
func (c *testCA) token(ns, sa string, ttl time.Duration) string {
	enc := base64.RawURLEncoding
	h := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	claims, _ := json.Marshal(map[string]any{
		"sub": "system:serviceaccount:" + ns + ":" + sa, "exp": time.Now().Add(ttl).Unix(),
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]string{"name": sa}},
	})
	body := h + "." + enc.EncodeToString(claims)
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(body))
	return body + "." + enc.EncodeToString(m.Sum(nil))
}

// identity verifies a token and returns the SPIFFE ID it stands for.
func (c *testCA) identity(tok string) (string, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", errors.New("malformed token")
	}
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(parts[0] + "." + parts[1]))
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	if !hmac.Equal(sig, m.Sum(nil)) {
		return "", errors.New("bad token signature")
	}
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var cl struct {
		Exp int64 `json:"exp"`
		K8s struct {
			Namespace string `json:"namespace"`
			SA        struct {
				Name string `json:"name"`
			} `json:"serviceaccount"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(raw, &cl); err != nil {
		return "", err
	}
	if time.Now().Unix() > cl.Exp {
		return "", errors.New("token expired")
	}
	id, err := pki.WorkloadID(c.td, cl.K8s.Namespace, cl.K8s.SA.Name)
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// sign issues a leaf for id over the CSR's key, under the newest root.
func (c *testCA) sign(csrPEM []byte, id string, ttl time.Duration) ([]string, error) {
	csr, err := pki.ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	if ttl <= 0 {
		ttl = time.Hour
	}
	if rogue := c.rogueID.Load(); rogue != nil {
		id = *rogue
	}
	u, _ := url.Parse(id)
	c.mu.Lock()
	root, key := c.roots[0], c.keys[0]
	c.mu.Unlock()
	above := []*x509.Certificate{root}
	if p := c.phased.Load(); p != nil {
		root, key, above = p.signer.Cert, p.signer.Key, p.above
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial(), URIs: []*url.URL{u}, NotBefore: now.Add(-time.Second), NotAfter: now.Add(ttl),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, csr.PublicKey, key)
	if err != nil {
		return nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	return pki.CertPEMs(append([]*x509.Certificate{leaf}, above...)), nil
}

func (c *testCA) enter() func() {
	n := c.inFlight.Add(1)
	for {
		m := c.maxFlight.Load()
		if n <= m || c.maxFlight.CompareAndSwap(m, n) {
			break
		}
	}
	c.requests.Add(1)
	if c.delay > 0 {
		time.Sleep(c.delay)
	}
	return func() { c.inFlight.Add(-1) }
}

// serveNATS answers sign requests on nc until the test ends.
func (c *testCA) serveNATS(tb testing.TB, nc *nats.Conn) {
	sub, err := nc.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) {
		if c.silent.Load() {
			return
		}
		defer c.enter()()
		reply := c.handleNATS(tb, m)
		// Answered in the request's encoding, as the signer does.
		out, err := events.NewSignReplyMsg(m.Reply, encodingOf(m), "test-ca", reply)
		if err != nil {
			panic(err)
		}
		_ = m.RespondMsg(out)
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = sub.Unsubscribe() })
	bsub, err := nc.QueueSubscribe(events.SubjectTrustBundle, events.SignerQueue, func(m *nats.Msg) {
		roots, gen, ends := c.current(tb)
		r := events.BundleReply{TrustDomain: c.td, Roots: roots, Generation: gen, Endorsements: ends}
		if req, _, err := events.Decode[events.BundleRequest](m); err == nil && req.Federation {
			st := events.FederationStatus{Signer: "test-ca", At: time.Now(), Domains: []events.FederatedDomain{}}
			c.mu.Lock()
			for _, td := range c.federated {
				st.Domains = append(st.Domains, events.FederatedDomain{TrustDomain: td, State: events.FederationOK})
			}
			c.mu.Unlock()
			r.Federation, _ = json.Marshal(st)
		}
		out, _ := events.NewMsg(m.Reply, "test-ca", r)
		_ = m.RespondMsg(out)
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = bsub.Unsubscribe() })
}

// encodingOf is the encoding a sign request came in.
func encodingOf(m *nats.Msg) events.Encoding {
	if events.IsCompact(m) {
		return events.EncodingCompact
	}
	return events.EncodingJSON
}

func replyErr(code, msg string) events.SignReply {
	return events.SignReply{Error: &events.ReplyError{Code: code, Message: msg}}
}

func (c *testCA) handleNATS(tb testing.TB, m *nats.Msg) events.SignReply {
	if c.failNext.Add(-1) >= 0 {
		return replyErr(events.CodeUnavailable, "injected failure")
	}
	c.failNext.Store(0)
	req, _, err := events.DecodeSignRequest(m)
	if err != nil {
		return replyErr(events.CodeInvalidArgument, err.Error())
	}
	c.lastReq.Store(&req)
	var id string
	if req.Token != "" {
		if id, err = c.identity(req.Token); err != nil {
			return replyErr(events.CodeUnauthenticated, err.Error())
		}
	} else if id, err = c.proofIdentity(req); err != nil {
		return replyErr(events.CodeUnauthenticated, err.Error())
	}
	chain, signer, err := c.signAs([]byte(req.CSR), id, req.TTL, req.CertSigner)
	if err != nil {
		return replyErr(events.CodeInvalidArgument, err.Error())
	}
	roots, gen, ends := c.current(tb)
	return events.SignReply{CertChain: chain, Roots: roots, TrustDomain: c.td, Generation: gen, Endorsements: ends, Signer: signer}
}

// proofIdentity authenticates a renewal by a still-valid leaf and a proof over the CSR.
func (c *testCA) proofIdentity(req events.SignRequest) (string, error) {
	chain, err := pki.ParseCertPEMs(req.CertChain)
	if err != nil || len(chain) == 0 {
		return "", fmt.Errorf("cert_chain: %v", err)
	}
	pool := x509.NewCertPool()
	c.mu.Lock()
	for _, r := range c.roots {
		pool.AddCert(r)
	}
	c.mu.Unlock()
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return "", err
	}
	csr, err := pki.ParseCSR([]byte(req.CSR))
	if err != nil {
		return "", err
	}
	sig, _ := base64.StdEncoding.DecodeString(req.Proof)
	if err := pki.VerifyProof(chain[0].PublicKey, csr.Raw, sig); err != nil {
		return "", err
	}
	return chain[0].URIs[0].String(), nil
}

// serveGRPC serves IstioCertificateService over TLS on loopback and returns its
// address. The server certificate is issued by the current root for 127.0.0.1.
func (c *testCA) serveGRPC(tb testing.TB) string {
	c.mu.Lock()
	root := &testkit.CA{Cert: c.roots[0], Key: c.keys[0]}
	c.mu.Unlock()
	cert := root.Issue(tb, testkit.Spec{Name: "istiod", IPs: []net.IP{net.ParseIP("127.0.0.1")}}).TLS()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert})))
	pb.RegisterIstioCertificateServiceServer(srv, istioServer{c: c})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(lis)
	tb.Cleanup(srv.Stop)
	return lis.Addr().String()
}

type istioServer struct {
	pb.UnimplementedIstioCertificateServiceServer
	c *testCA
}

func (s istioServer) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	defer s.c.enter()()
	md, _ := metadata.FromIncomingContext(ctx)
	s.c.lastMD.Store(&md)
	auth := md.Get("authorization")
	var id string
	var err error
	switch {
	case len(auth) == 1 && strings.HasPrefix(auth[0], "Bearer "):
		id, err = s.c.identity(strings.TrimPrefix(auth[0], "Bearer "))
	case len(auth) == 0:
		// As istiod's x509 authenticator: a still-valid client certificate chaining to
		// the roots, the identity its SPIFFE URI.
		id, err = s.c.peerIdentity(ctx)
	default:
		err = errors.New("authorization metadata must be one \"Bearer <token>\"")
	}
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	name := req.GetMetadata().GetFields()["CertSigner"].GetStringValue()
	s.c.lastSigner.Store(&name)
	chain, signer, err := s.c.signAs([]byte(req.GetCsr()), id, time.Duration(req.GetValidityDuration())*time.Second, name)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if signer != nil {
		b, _ := json.Marshal(signer)
		_ = grpc.SetHeader(ctx, metadata.Pairs(events.SignerRootsHeader, string(b)))
	}
	if h := s.c.bundleHeader.Load(); h != nil {
		_ = grpc.SetHeader(ctx, metadata.Pairs(events.TrustBundleHeader, *h))
	}
	return &pb.IstioCertificateResponse{CertChain: chain}, nil
}

// peerIdentity authenticates the caller by its mTLS client certificate.
func (c *testCA) peerIdentity(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", errors.New("no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return "", errors.New("no bearer token and no client certificate")
	}
	chain := ti.State.PeerCertificates
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	c.mu.Lock()
	for _, r := range c.roots {
		opts.Roots.AddCert(r)
	}
	c.mu.Unlock()
	for _, x := range chain[1:] {
		opts.Intermediates.AddCert(x)
	}
	if _, err := chain[0].Verify(opts); err != nil {
		return "", fmt.Errorf("client certificate: %w", err)
	}
	if len(chain[0].URIs) != 1 {
		return "", errors.New("client certificate has no single SPIFFE URI")
	}
	c.certAuth.Add(1)
	return chain[0].URIs[0].String(), nil
}
