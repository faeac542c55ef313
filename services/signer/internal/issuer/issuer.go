// Package issuer is the transport-independent core of the signer: it checks a
// request, authenticates the caller, signs the CSR's key for the caller's SPIFFE ID
// and records the certificate with a cert.issued event. It takes the one request
// type, events.SignRequest: the NATS front end passes on what it decoded, the gRPC
// front end maps Istio's request onto it; each adds what its transport proved (Via).
package issuer

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/authn"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/nats-io/nats.go"
)

// Transports, as cert.issued and the metrics name them.
const (
	TransportNATS = "nats"
	TransportGRPC = "grpc"
)

// DefaultResource is the only SDS resource name the CA issues certificates for.
const DefaultResource = "default"

// Via is what the transport itself proved about a request, beside what the
// request says (events.SignRequest, the one request type from sds-edge to here).
type Via struct {
	Transport string // TransportNATS or TransportGRPC
	// PeerChain is the mTLS client chain; the handshake proved its key. It is the
	// credential when the request carries no token.
	PeerChain []*x509.Certificate
	// BusPod is the pod the bus vouches for: the pod sign subject the request came
	// on, which NATS permissions let only that pod (namespace and name) publish to.
	BusPod events.PodRef
	// Impersonate is the identity the caller asks for instead of its own (Istio's
	// ImpersonatedIdentity request metadata): only a trusted node agent gets it.
	Impersonate string
	// BusID is the identity the bus vouches for: the identity sign subject the
	// request came on (events.IdentityFromSignSubject), which only a connection the
	// auth callout admitted with a token proving that identity may publish on. When
	// set it is the credential: no token is verified (the callout did, once per
	// connection), the CSR is still checked and the TTL still bounded.
	BusID *url.URL
}

// SourceBus is cert.issued's auth_source for a request authenticated by its identity
// sign subject (Via.BusID).
const SourceBus = "bus"

// Result is an issued certificate.
type Result struct {
	Leaf  *x509.Certificate
	Chain []string // leaf first, root last
	Roots []string // the whole trust bundle
	// Generation and Endorsements are those of the bundle the leaf was signed with.
	Generation   uint64
	Endorsements []events.Endorsement
	// Signing is the material that signed the leaf (its Chain follows the leaf);
	// Bundle the one whose trust bundle, generation and endorsements the reply
	// carries. They differ for a named signer.
	Signing, Bundle *ca.Material
	// Signer is, for a named signer's leaf, that signer's roots endorsed by the
	// mesh CA (Bundle): what lets the pod accept a chain ending at them.
	Signer *events.SignerRoots
}

// Error is a request error with a code from events (CodeInvalidArgument, ...).
type Error struct {
	Code string
	Msg  string
}

func (e *Error) Error() string { return e.Code + ": " + e.Msg }

func errf(code, format string, a ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, a...)}
}

// Config holds the issuing policy.
type Config struct {
	TrustDomain string
	Instance    string
	DefaultTTL  time.Duration
	MaxTTL      time.Duration
	// PodMaxTTL caps the lifetime of a certificate for a pod (one recorded for a
	// pod, or asked with a pod-bound token): a longer request is clamped to it,
	// counted (Metrics.Clamped) and logged. 0: no cap below MaxTTL.
	PodMaxTTL time.Duration
	Signers   []string // accepted CertSigner names besides ""
	// Named holds the material of the named signers; nil: a CertSigner is only
	// checked against Signers and signed by the mesh CA.
	Named *ca.NamedSigners
	// Nodes authorizes impersonation by trusted node agents; nil: nobody may.
	Nodes NodeAuthorizer
	// Records keeps which pod each certificate was issued to (issued.Store), what
	// the bus auth callout admits a pod's certificate by; nil: none kept.
	Records Recorder
	// MaxEarlyPerMinute is the most early certificates (the one before less than a
	// quarter through its life) one pod, or SPIFFE ID without a pod, is issued per
	// ReissueWindow by this replica; more are refused with a reason (a pod that keeps
	// asking refuses what it gets); 0: no limit.
	MaxEarlyPerMinute int
	// Lives is told, before the mesh CA signs a leaf, how long it will live
	// (ca.SelfSigned: a rotation's phases last as long as the longest leaf issued);
	// nil: nobody.
	Lives LifeRecorder
}

// LifeRecorder records the lifetime of a leaf about to be signed; an error refuses it.
type LifeRecorder interface {
	NoteLife(ctx context.Context, life time.Duration) error
}

var _ LifeRecorder = (*ca.SelfSigned)(nil)

// Recorder makes the write recording that leaf was issued to pod (issued.Store),
// which the issuer stores durably beside cert.issued.
type Recorder interface {
	Msg(leaf *x509.Certificate, pod events.PodRef, podUID string, now time.Time) (*nats.Msg, error)
}

// NodeAuthorizer decides whether an authenticated caller may have target's identity
// (authn.NodeAuthorizer: a trusted node agent, for a workload on its node).
type NodeAuthorizer interface {
	Authorize(ctx context.Context, caller authn.Caller, target string) (authn.Caller, error)
}

var _ NodeAuthorizer = (*authn.NodeAuthorizer)(nil)

// Publisher records an event durably (bus.Publish in production).
type Publisher func(ctx context.Context, msg *nats.Msg) error

// TokenVerifier checks a bearer token (authn.JWTVerifier offline, authn.TokenReviewer
// by the API server); every request's token is checked.
type TokenVerifier interface {
	Verify(token string) (authn.Caller, error)
}

var (
	_ TokenVerifier = (*authn.JWTVerifier)(nil)
	_ TokenVerifier = (*authn.TokenReviewer)(nil)
)

// Issuer signs requests.
type Issuer struct {
	cfg     Config
	auth    *ca.Authority
	tokens  TokenVerifier
	publish Publisher
	metrics *Metrics
	log     hclog.Logger
	clk     clock.Clock
	again   *reissues
	answers answers
	vouched vouched
	finish  finishTime
}

// New returns an issuer. tokens may be nil (tokens then fail to authenticate).
func New(cfg Config, auth *ca.Authority, tokens TokenVerifier, publish Publisher, metrics *Metrics, log hclog.Logger, clk clock.Clock) *Issuer {
	return &Issuer{cfg: cfg, auth: auth, tokens: tokens, publish: publish, metrics: metrics, log: log, clk: clk,
		again: &reissues{limit: cfg.MaxEarlyPerMinute}}
}

func (i *Issuer) now() time.Time { return i.clk.Now() }

// Source is the CloudEvents source of this signer's events.
func (i *Issuer) Source() string { return "meshagent/signer/" + i.cfg.Instance }

// Instance is this signer replica's instance id.
func (i *Issuer) Instance() string { return i.cfg.Instance }

// Issue checks, authenticates and signs req, which came via the transport named in
// via. Exactly one credential is used: req.Token if set, else via.PeerChain, else
// req.CertChain with req.Proof. req.Pod must be proved, by via.BusPod or by a
// pod-bound token. A TTL <= 0 asks for the default. Any error leaves no trace but
// metrics and a log line: no certificate is returned and no event is published.
func (i *Issuer) Issue(ctx context.Context, req events.SignRequest, via Via) (Result, error) {
	is, err := i.prepare(ctx, req, via)
	if err != nil {
		return Result{}, err
	}
	if is.repeat {
		return is.res, nil
	}
	pctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	// In order, cert.issued last, as IssueThen.
	for _, m := range is.msgs {
		if err = i.publish(pctx, m); err != nil {
			break
		}
	}
	i.finish.observe(i.now().Sub(is.signed))
	return is.recorded(err)
}

// recordTimeout bounds how long a certificate's cert.issued may take to be stored.
const recordTimeout = 10 * time.Second

// AsyncPublisher stores an event and calls back once it is stored or has failed
// (bus.AsyncPublisher).
type AsyncPublisher interface {
	Publish(msg *nats.Msg, deadline time.Time, done func(error))
}

var _ AsyncPublisher = (*bus.AsyncPublisher)(nil)

// IssueThen is Issue for a caller that answers once cert.issued is stored without
// holding a goroutine meanwhile: it checks, authenticates and signs now, then
// calls done exactly once, from pub's ack reader when the event is stored (or
// failed), or at once when the request is refused. done gets what Issue returns.
func (i *Issuer) IssueThen(ctx context.Context, req events.SignRequest, via Via, pub AsyncPublisher, done func(Result, error)) {
	is, err := i.prepare(ctx, req, via)
	if err != nil {
		done(Result{}, err)
		return
	}
	if is.repeat {
		done(is.res, nil)
		return
	}
	deadline := i.now().Add(recordTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// One write after the other, cert.issued last: a write that fails refuses the
	// request, and the CA's history then never names a certificate that was refused
	// (its record not stored in time during a stream election, the requester given
	// nothing). A record whose event failed names a certificate nobody holds.
	var store func(k int)
	store = func(k int) {
		pub.Publish(is.msgs[k], deadline, func(err error) {
			if err != nil || k == len(is.msgs)-1 {
				i.finish.observe(i.now().Sub(is.signed))
				done(is.recorded(err))
				return
			}
			store(k + 1)
		})
	}
	store(0)
}

// issued is a signed certificate whose writes are yet to be stored, in order: for
// a pod's certificate its record (Config.Records), then cert.issued.
type issued struct {
	i      *Issuer
	signed time.Time // when its signing began (the finish margin counts from here)
	res    Result
	ev     events.CertIssued
	msgs   []*nats.Msg
	via    Via
	src    string // the caller's auth source
	// key is what the certificate answers once recorded (answers); nil: kept for none.
	key *answerKey
	// repeat: res is a certificate already recorded for the same request, and there
	// is nothing to write.
	repeat bool
}

// recorded is the outcome once storing cert.issued returned err: the result, or
// (the event not stored) an unavailable error and no certificate.
func (is *issued) recorded(err error) (Result, error) {
	i, t := is.i, is.via.Transport
	if err != nil {
		// The caller gets nothing: a certificate that was never recorded would never be renewed.
		i.metrics.SignFail.WithLabelValues(t).Inc()
		i.log.Error("record cert.issued failed", "serial", is.ev.Serial, "error", err)
		return Result{}, errf(events.CodeUnavailable, "could not record the certificate: %v", err)
	}
	i.metrics.Issued.WithLabelValues(t).Inc()
	if is.key != nil {
		i.answers.put(*is.key, is.res.Leaf, is.res.Signing, i.now())
	}
	if i.log.IsDebug() { // per request: its arguments are not even built at info
		i.log.Debug("certificate issued", "serial", is.ev.Serial, "spiffe_id", is.ev.SPIFFEID, "transport", t, "auth", is.src, "not_after", is.res.Leaf.NotAfter)
	}
	return is.res, nil
}

// prepare checks, authenticates and signs req and encodes its cert.issued.
func (i *Issuer) prepare(ctx context.Context, req events.SignRequest, via Via) (*issued, error) {
	t := via.Transport
	i.metrics.Received.WithLabelValues(t).Inc()
	reject := func(reason string, err *Error) (*issued, error) {
		i.metrics.Rejected.WithLabelValues(t, reason).Inc()
		i.log.Debug("request rejected", "transport", t, "reason", reason, "error", err.Msg)
		return nil, err
	}
	// A request whose requester has stopped waiting is dropped before any work
	// (a backlog read by a signer that was frozen), and again just before signing.
	expired := func() (*issued, error) {
		i.metrics.Expired.WithLabelValues(t).Inc()
		i.log.Debug("request dropped: its requester stopped waiting", "transport", t, "deadline", req.Deadline, "late", i.now().Sub(req.Deadline))
		return nil, errf(events.CodeDeadlineExceeded, "request expired at %s: its requester stopped waiting", req.Deadline.UTC().Format(time.RFC3339Nano))
	}
	if req.Expired(i.now()) {
		return expired()
	}
	if len(req.CSR) > events.MaxEventSize {
		return reject("too_large", errf(events.CodeResourceExhausted, "csr is %d bytes, limit %d", len(req.CSR), events.MaxEventSize))
	}
	if req.CertSigner != "" && !slices.Contains(i.cfg.Signers, req.CertSigner) {
		return reject("unknown_signer", errf(events.CodeInvalidArgument, "unknown cert signer %q", req.CertSigner))
	}
	ttl := i.cfg.DefaultTTL
	if req.TTL > 0 {
		ttl = req.TTL
	}
	if ttl > i.cfg.MaxTTL {
		return reject("ttl", errf(events.CodeInvalidArgument, "requested TTL %s is greater than the max allowed TTL %s", ttl, i.cfg.MaxTTL))
	}
	// Only the default SDS resource is CA-issued; ROOTCA and others are not certificates.
	if req.Resource != "" && req.Resource != DefaultResource {
		return reject("resource", errf(events.CodeInvalidArgument, "resource %q is not signed by the CA: only %q (or empty) is", req.Resource, DefaultResource))
	}
	if !req.Pod.IsZero() {
		if err := req.Pod.Validate(); err != nil {
			return reject("pod", errf(events.CodeInvalidArgument, "%v", err))
		}
	}
	mat := i.auth.Current()
	if mat == nil {
		return reject("not_ready", errf(events.CodeUnavailable, "CA not loaded yet"))
	}
	csr, err := pki.ParseCSR([]byte(req.CSR))
	if err != nil {
		i.metrics.ParseFail.WithLabelValues(t).Inc()
		return reject("csr", errf(events.CodeInvalidArgument, "%v", err))
	}
	alg, err := pki.AlgOf(csr.PublicKey)
	if err != nil {
		i.metrics.ParseFail.WithLabelValues(t).Inc()
		return reject("csr", errf(events.CodeInvalidArgument, "csr key: %v", err))
	}
	if req.KeyAlgorithm != "" {
		if said, err := pki.ParseKeyAlg(req.KeyAlgorithm); err != nil || said != alg {
			return reject("key_algorithm", errf(events.CodeInvalidArgument, "key_algorithm %q does not match the CSR's %s key", req.KeyAlgorithm, alg))
		}
	}
	caller, err := i.authenticate(req, via, csr, mat)
	if errors.Is(err, authn.ErrUnavailable) {
		// No verdict on the token (the API server did not answer): the caller retries.
		return reject("auth_unavailable", errf(events.CodeUnavailable, "%v", err))
	}
	if err != nil {
		i.metrics.AuthFailures.WithLabelValues(t).Inc()
		return reject("auth", errf(events.CodeUnauthenticated, "%v", err))
	}
	if via.Impersonate != "" {
		if i.cfg.Nodes == nil {
			return reject("impersonation", errf(events.CodePermissionDenied, "%s may not impersonate %q: no node agent is trusted to (CA_TRUSTED_NODE_ACCOUNTS is empty)", caller.ID, via.Impersonate))
		}
		target, err := i.cfg.Nodes.Authorize(ctx, caller, via.Impersonate)
		if errors.Is(err, authn.ErrUnavailable) {
			return reject("auth_unavailable", errf(events.CodeUnavailable, "%v", err))
		}
		if err != nil {
			i.log.Warn("impersonation refused", "transport", t, "spiffe_id", caller.ID.String(), "impersonate", via.Impersonate, "error", err)
			return reject("impersonation", errf(events.CodePermissionDenied, "%v", err))
		}
		i.log.Info("impersonation", "transport", t, "node_agent", caller.ID.String(), "spiffe_id", target.ID.String())
		caller = target
	}
	// The rotator keys its schedule on (pod, resource), so a certificate recorded
	// for the wrong pod would replace that pod's entry: every pod named must be proved.
	pod, perr := provePod(req.Pod, via.BusPod, caller)
	if perr != nil {
		i.log.Warn("pod not proved", "transport", t, "spiffe_id", caller.ID.String(), "request_pod", req.Pod, "bus_pod", via.BusPod, "token_pod", caller.Pod)
		return reject("pod_mismatch", perr)
	}
	if (!pod.IsZero() || !caller.Pod.IsZero()) && i.cfg.PodMaxTTL > 0 && ttl > i.cfg.PodMaxTTL {
		i.metrics.Clamped.WithLabelValues(t).Inc()
		i.log.Info("ttl clamped", "transport", t, "spiffe_id", caller.ID.String(), "pod", cmp.Or(pod, caller.Pod), "requested", ttl, "granted", i.cfg.PodMaxTTL)
		ttl = i.cfg.PodMaxTTL
	}
	now := i.now()
	// A pod is its namespace/name; a caller that is no pod, its SPIFFE ID.
	holder := caller.ID.String()
	if !pod.IsZero() {
		holder = pod.String()
	}
	// A repeat of a request whose certificate was recorded moments ago (its answer
	// was lost) gets that certificate: nothing is signed, written or counted again.
	// Only the mesh CA's certificates are kept (a named signer's material is chosen
	// below).
	var key *answerKey
	if req.CertSigner == "" {
		k := newAnswerKey(holder, caller.ID.String(), req.Resource, ttl, csr.Raw)
		key = &k
		if res, ok := i.answers.get(k, mat, now); ok {
			i.metrics.Repeats.WithLabelValues(t).Inc()
			i.log.Debug("request repeated: answered with the certificate already recorded for it", "transport", t, "holder", holder, "serial", pki.SerialHex(res.Leaf))
			return &issued{i: i, signed: now, res: res, via: via, src: caller.Source, repeat: true}, nil
		}
	}
	if ok, n, next := i.again.allow(holder, now); !ok {
		i.log.Warn("not issuing: the holder keeps asking for certificates", "transport", t, "holder", holder, "issued", n, "window", ReissueWindow)
		return reject("reissue_limit", errf(events.CodeResourceExhausted,
			"%s was issued %d certificates in the last %s, each before the one before it was a quarter through its life, and keeps asking: it may be refusing them (check that its trust bundle, ROOTCA, accepts the chain); the next is issued after %s",
			holder, n, ReissueWindow, next.UTC().Format(time.RFC3339)))
	}
	// A named signer signs with its own chain; the caller was authenticated against
	// the mesh's roots above.
	signing := mat
	if req.CertSigner != "" && i.cfg.Named != nil {
		named, err := i.cfg.Named.Material(req.CertSigner, now)
		if err != nil {
			return reject("signer_material", errf(events.CodeInvalidArgument, "%v", err))
		}
		signing = named
	}
	if req.Expired(i.now()) {
		return expired()
	}
	if i.finish.tooLate(req.Deadline, i.now()) {
		i.metrics.Expired.WithLabelValues(t).Inc()
		i.log.Debug("request dropped: too little time left to answer it", "transport", t, "deadline", req.Deadline, "left", req.Deadline.Sub(i.now()), "needed", i.finish.margin())
		return nil, errf(events.CodeDeadlineExceeded, "request expires at %s, sooner than its answer could be recorded and sent (%s)", req.Deadline.UTC().Format(time.RFC3339Nano), i.finish.margin())
	}
	if signing == mat && i.cfg.Lives != nil {
		if err := i.cfg.Lives.NoteLife(ctx, ttl+ca.Backdate); err != nil {
			i.metrics.SignFail.WithLabelValues(t).Inc()
			i.log.Error("sign refused: leaf lifetime not recorded", "spiffe_id", caller.ID.String(), "error", err)
			return nil, errf(events.CodeUnavailable, "%v", err)
		}
	}
	leaf, err := signing.SignLeaf(csr.PublicKey, caller.ID, now, ttl)
	if err != nil {
		i.metrics.SignFail.WithLabelValues(t).Inc()
		i.log.Error("sign failed", "spiffe_id", caller.ID.String(), "error", err)
		if errors.Is(err, ca.ErrCAExpired) {
			return nil, errf(events.CodeUnavailable, "%v", err)
		}
		return nil, errf(events.CodeInternal, "sign: %v", err)
	}
	leafPEM := string(pki.EncodeCertPEM(leaf))
	ev := events.CertIssued{
		Serial: pki.SerialHex(leaf), SPIFFEID: caller.ID.String(), NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter,
		Pod: pod, Resource: req.Resource, KeyAlgorithm: string(alg), AuthSource: caller.Source,
		Signer: i.cfg.Instance, Transport: t, RootFingerprint: signing.RootFingerprint(),
		CertChain: append([]string{leafPEM}, signing.IntermediatePEMs()...),
	}
	if signing != mat {
		ev.CertSigner = req.CertSigner // its chain ends at the named signer's root
	}
	msg, err := events.Encode(events.SubjectCertIssued, events.Meta{Source: i.Source(), Subject: ev.Serial, Time: now}, ev)
	var msgs []*nats.Msg
	if err == nil && !pod.IsZero() && i.cfg.Records != nil {
		var rec *nats.Msg
		rec, err = i.cfg.Records.Msg(leaf, pod, caller.PodUID, now)
		msgs = append(msgs, rec)
	}
	msgs = append(msgs, msg)
	if err != nil {
		i.metrics.SignFail.WithLabelValues(t).Inc()
		i.log.Error("record cert.issued failed", "serial", ev.Serial, "error", err)
		return nil, errf(events.CodeInternal, "could not record the certificate: %v", err)
	}
	i.again.issued(holder, now, leaf.NotAfter.Sub(now)) // its life from now: NotBefore is backdated
	res := leafResult(leaf, leafPEM, signing, mat)
	if signing != mat {
		if res.Signer, err = i.vouched.get(i.cfg.TrustDomain, req.CertSigner, mat, signing); err != nil {
			i.metrics.SignFail.WithLabelValues(t).Inc()
			i.log.Error("named signer's roots not endorsed", "signer", req.CertSigner, "error", err)
			return nil, errf(events.CodeInternal, "endorse signer %q's roots: %v", req.CertSigner, err)
		}
	}
	return &issued{i: i, signed: now, res: res, ev: ev, msgs: msgs, via: via, src: caller.Source, key: key}, nil
}

// leafResult is the answer for leaf, signed by signing, with bundle's trust bundle,
// generation and endorsements (the same material unless a named signer signed).
func leafResult(leaf *x509.Certificate, leafPEM string, signing, bundle *ca.Material) Result {
	return Result{Leaf: leaf, Chain: append([]string{leafPEM}, signing.ChainPEMs()...), Roots: bundle.RootPEMs(),
		Generation: bundle.Generation, Endorsements: bundle.Endorsements(), Signing: signing, Bundle: bundle}
}

// meshResult is leafResult for a leaf the mesh CA's material signed.
func meshResult(leaf *x509.Certificate, leafPEM string, mat *ca.Material) Result {
	return leafResult(leaf, leafPEM, mat, mat)
}

// vouched keeps each named signer's roots as the mesh CA endorsed them, made
// again when either material changes.
type vouched struct {
	mu sync.Mutex
	by map[string]vouchedEntry // by signer name
}

type vouchedEntry struct {
	mesh, named *ca.Material
	roots       *events.SignerRoots
}

func (v *vouched) get(trustDomain, name string, mesh, named *ca.Material) (*events.SignerRoots, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e, ok := v.by[name]; ok && e.mesh == mesh && e.named == named {
		return e.roots, nil
	}
	roots, err := mesh.EndorseSigner(trustDomain, name, named)
	if err != nil {
		return nil, err
	}
	if v.by == nil {
		v.by = map[string]vouchedEntry{}
	}
	v.by[name] = vouchedEntry{mesh: mesh, named: named, roots: roots}
	return roots, nil
}

func (i *Issuer) authenticate(req events.SignRequest, via Via, csr *x509.CertificateRequest, mat *ca.Material) (authn.Caller, error) {
	peer := via.PeerChain
	switch {
	case via.BusID != nil:
		return authn.Caller{ID: via.BusID, Source: SourceBus, Pod: via.BusPod}, nil
	case req.Token != "":
		if i.tokens == nil {
			return authn.Caller{}, fmt.Errorf("%w: bearer tokens are not accepted: no JWKS or TokenReview configured", authn.ErrUnauthenticated)
		}
		i.metrics.TokensVerified.WithLabelValues(via.Transport).Inc()
		return i.tokens.Verify(req.Token)
	case len(peer) > 0:
		return authn.VerifyCert(peer, mat.Roots, i.cfg.TrustDomain, x509.VerifyOptions{CurrentTime: i.now()})
	case len(req.CertChain) > 0:
		chain, err := pki.ParseCertPEMs(req.CertChain)
		if err != nil {
			return authn.Caller{}, fmt.Errorf("%w: cert_chain: %v", authn.ErrUnauthenticated, err)
		}
		caller, err := authn.VerifyCert(chain, mat.Roots, i.cfg.TrustDomain, x509.VerifyOptions{CurrentTime: i.now()})
		if err != nil {
			return caller, err
		}
		sig, err := base64.StdEncoding.DecodeString(req.Proof)
		if err != nil {
			return authn.Caller{}, fmt.Errorf("%w: proof is not base64: %v", authn.ErrUnauthenticated, err)
		}
		if err := pki.VerifyProof(chain[0].PublicKey, csr.Raw, sig); err != nil {
			return authn.Caller{}, fmt.Errorf("%w: %v", authn.ErrUnauthenticated, err)
		}
		return caller, nil
	}
	return authn.Caller{}, fmt.Errorf("%w: no credential: send a bearer token or a client certificate", authn.ErrUnauthenticated)
}

// AuthMalformed counts a request whose credential could not even be read (a
// malformed authorization header).
func (i *Issuer) AuthMalformed(transport string) {
	i.metrics.Received.WithLabelValues(transport).Inc()
	i.metrics.AuthFailures.WithLabelValues(transport).Inc()
	i.metrics.Rejected.WithLabelValues(transport, "auth").Inc()
}

// Malformed counts a request that could not even be decoded.
func (i *Issuer) Malformed(transport string, tooLarge bool) {
	i.metrics.Received.WithLabelValues(transport).Inc()
	reason := "malformed"
	if tooLarge {
		reason = "too_large"
	}
	i.metrics.Rejected.WithLabelValues(transport, reason).Inc()
}

// provePod returns the pod a certificate is recorded for: the one the bus subject
// proves, else the one a pod-bound token proves, else none. A pod named by the
// request, or by the token, that disagrees with what is proved is refused.
//
// A pod is namespace + name, and a pod is only ever in its identity's namespace: a
// proved pod of another namespace than the certificate's SPIFFE ID is refused, so
// that no certificate is recorded for (and no schedule entry replaced of) a pod of
// another namespace.
func provePod(reqPod, busPod events.PodRef, caller authn.Caller) (events.PodRef, *Error) {
	var none events.PodRef
	proved := busPod
	if !caller.Pod.IsZero() {
		if !proved.IsZero() && proved != caller.Pod {
			return none, errf(events.CodePermissionDenied, "request came on pod %q's subject but the token was issued for pod %q", proved, caller.Pod)
		}
		proved = caller.Pod
	}
	if !reqPod.IsZero() && reqPod != proved {
		if proved.IsZero() {
			return none, errf(events.CodePermissionDenied, "request names pod %q, which neither its bus subject nor its token proves", reqPod)
		}
		return none, errf(events.CodePermissionDenied, "request names pod %q but its credentials prove pod %q", reqPod, proved)
	}
	if !proved.IsZero() {
		if _, ns, _, err := pki.ParseWorkloadID(caller.ID.String()); err != nil || ns != proved.Namespace {
			return none, errf(events.CodePermissionDenied, "pod %q is not in the namespace of identity %s", proved, caller.ID)
		}
	}
	return proved, nil
}
