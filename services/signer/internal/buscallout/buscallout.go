// Package buscallout is nats-server's auth callout for pods: a pod connects to the
// bus with its Kubernetes service-account token, or with none and its mesh
// certificate as its TLS client certificate (a VM), and this responder admits it as
// that pod (pkg/bus/policy's pod permissions, for the pod the token is bound to or
// the certificate was issued to, until the credential expires) or refuses it. It
// runs inside the signer, which already verifies these tokens and certificates for
// signing.
package buscallout

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// Verifier checks a bearer token (authn.JWTVerifier, authn.TokenReviewer): the
// interface authn.Config.Build returns, which the signer hands the callout.
type Verifier = authn.TokenVerifier

// Dial connects to the bus as the callout user.
type Dial func(ctx context.Context) (*nats.Conn, error)

// Reasons a connection is refused, the label of the refusal metric.
const (
	ReasonMalformed   = "malformed_request"
	ReasonNoToken     = "no_token"
	ReasonBadToken    = "bad_token"
	ReasonNotPodBound = "not_pod_bound"
	// ReasonNotReady: the signer cannot check tokens yet (its keys are not loaded);
	// the pod's client reconnects and is admitted once they are.
	ReasonNotReady = "not_ready"
	// ReasonUnavailable: the token could not be checked (the API server's
	// TokenReview did not answer); the pod's client reconnects.
	ReasonUnavailable = "unavailable"
	// ReasonNotSubjectSafe: the token's namespace or service account cannot be one
	// subject token, so it cannot be granted its identity sign subject (refused,
	// never escaped: two identities must never share a subject).
	ReasonNotSubjectSafe = "identity_not_subject_safe"
	// ReasonTooManyConnections: the pod already had PodLimits.MaxAdmissions
	// connections admitted within one user lifetime.
	ReasonTooManyConnections = "too_many_connections"
)

// Responder answers the server's auth callout requests.
type Responder struct {
	issuer nkeys.KeyPair
	verify Verifier
	certs  *Certificates
	dial   Dial
	log    hclog.Logger
	clk    clock.Clock
	// admitted counts every admission, admittedByCert those by a client certificate.
	admitted       prometheus.Counter
	admittedByCert prometheus.Counter
	refused        *prometheus.CounterVec
	ready          atomic.Bool

	limits     policy.PodLimits
	admissions *admissions
	jitter     func() float64

	capacity  Capacity
	queue     chan pending
	shedding  chan *nats.Msg
	tokens    *tokenCache
	dropped   prometheus.Counter
	cacheHits prometheus.Counter

	nodeAgents    []string // <ns>/<sa> whose leaf connections are admitted as their node
	nodesAdmitted prometheus.Counter
}

func (r *Responder) now() time.Time { return r.clk.Now() }

// calloutOpts names a metric of the callout: meshagent_signer_<name>.
func calloutOpts(name, help string) prometheus.CounterOpts {
	return prometheus.CounterOpts{Namespace: "meshagent", Subsystem: "signer", Name: name, Help: help}
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(calloutOpts(name, help))
}

// New builds a responder that signs its answers with issuer (the account key named
// as the callout issuer in the server's configuration) and registers its metrics on
// reg. verify checks tokens (nil: none is accepted); certs, when not nil, admits a
// connection without a usable token by its TLS client certificate. Nothing connects
// until Run.
func New(issuer nkeys.KeyPair, verify Verifier, certs *Certificates, dial Dial, reg prometheus.Registerer, log hclog.Logger, clk clock.Clock) *Responder {
	r := &Responder{issuer: issuer, verify: verify, certs: certs, dial: dial, log: log, clk: clk,
		limits: policy.DefaultPodLimits(), admissions: newAdmissions(), jitter: rand.Float64,
		dropped: counter("bus_callout_dropped_total",
			"Connect requests dropped unanswered: the server had stopped waiting for them (its auth timeout passed while they were queued or checked), or the callout could neither queue nor refuse them."),
		cacheHits: counter("bus_callout_token_cache_hits_total",
			"Connections admitted with a token verified lately for another connection of the pod (not verified again)."),
		admitted: counter("bus_callout_admitted_total", "Pod connections to the bus admitted by the auth callout."),
		admittedByCert: counter("bus_callout_admitted_by_certificate_total",
			"Pod connections to the bus admitted by the auth callout by their client certificate (no usable token)."),
		nodesAdmitted: counter("bus_callout_nodes_admitted_total",
			"Node agents' leaf connections admitted by the auth callout, each as its node (the node tier)."),
		refused: prometheus.NewCounterVec(calloutOpts("bus_callout_refused_total", "Connections to the bus refused by the auth callout, by reason."), []string{"reason"}),
	}
	r.Tune(Capacity{})
	reasons := []string{ReasonBusy, ReasonMalformed, ReasonNoToken, ReasonBadToken, ReasonNotPodBound, ReasonNotReady, ReasonUnavailable, ReasonNotSubjectSafe, ReasonPodMismatch, ReasonTooManyConnections, ReasonNotANodeAgent, ReasonNoNode}
	if certs != nil {
		reasons = append(reasons, ReasonCertExpired, ReasonCertNotYetValid, ReasonCertForeignRoot, ReasonCertForeignDomain, ReasonBadCert, ReasonCertNotRecorded)
	}
	for _, reason := range reasons {
		r.refused.WithLabelValues(reason)
	}
	reg.MustRegister(r.admitted, r.admittedByCert, r.refused, r.dropped, r.cacheHits, r.nodesAdmitted)
	return r
}

// Tune sets how much work the responder takes on at once (zero fields: the
// defaults of DefaultCapacity); call it before Run.
func (r *Responder) Tune(c Capacity) *Responder {
	r.capacity = c.WithDefaults()
	r.queue = make(chan pending, r.capacity.Queue)
	r.shedding = make(chan *nats.Msg, r.capacity.Queue)
	r.tokens = newTokenCache(r.capacity.TokenCache, r.capacity.TokenCacheTTL)
	return r
}

// Limit sets the limits of the users the responder mints (default:
// policy.DefaultPodLimits; a zero field takes its default); call it before Run.
func (r *Responder) Limit(l policy.PodLimits) *Responder {
	r.limits = l.WithDefaults()
	return r
}

// Ready reports nil once the responder is subscribed.
func (r *Responder) Ready() error {
	if !r.ready.Load() {
		return errors.New("bus auth callout not subscribed")
	}
	return nil
}

// Run connects, answers requests until ctx ends, and drains the connection.
func (r *Responder) Run(ctx context.Context) error {
	nc, err := r.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("bus auth callout: %w", err)
	}
	wctx, stop := context.WithCancel(context.Background())
	workers := make(chan struct{})
	go func() { defer close(workers); r.work(wctx) }()
	defer func() {
		// No new requests first, then the workers end (what is still queued is
		// left to the server's auth timeout).
		bus.Drain(nc)
		stop()
		<-workers
	}()
	// A queue group: with several signer replicas, one answers each connect. The
	// handler only queues (or sheds); the workers decide.
	if _, err := nc.QueueSubscribe(policy.AuthCalloutSubject, events.SignerQueue, r.enqueue); err != nil {
		return fmt.Errorf("bus auth callout: subscribe: %w", err)
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("bus auth callout: subscribe: %w", err)
	}
	r.ready.Store(true)
	defer r.ready.Store(false)
	r.log.Info("bus auth callout serving", "subject", policy.AuthCalloutSubject, "workers", r.capacity.Workers, "queue", r.capacity.Queue)
	<-ctx.Done()
	return nil
}

// serve answers one queued request, unless the server has stopped waiting for it.
func (r *Responder) serve(p pending) {
	m := p.msg
	req, err := policy.DecodeAuthRequest(m.Data)
	if err != nil {
		// Not from a server (or garbled): there is no one to answer.
		r.refused.WithLabelValues(ReasonMalformed).Inc()
		r.log.Warn("bus auth request refused", "reason", ReasonMalformed, "error", err)
		return
	}
	resp, err := r.decide(req, deadline(req, p.received))
	if errors.Is(err, errGaveUp) {
		r.dropped.Inc()
		r.log.Debug("bus connect request dropped: the server stopped waiting", "client_host", req.ClientInformation.Host, "queued", r.now().Sub(p.received))
		return
	}
	if err != nil {
		r.log.Error("bus auth response failed", "error", err)
		return
	}
	if err := m.Respond(resp); err != nil {
		r.log.Warn("bus auth response not sent", "error", err)
	}
}

// decide admits a pod-bound, valid token as its pod until the token expires; with
// no token, or one refused, a client certificate this mesh issued to a pod as that
// pod until the certificate expires (byCert); and refuses everything else. A pod
// the connection claims (its user name) must be the one its credential proves.
// Past deadline (not zero) it answers nothing and admits no one (errGaveUp).
func (r *Responder) decide(req *jwt.AuthorizationRequestClaims, deadline time.Time) ([]byte, error) {
	gone := func() bool { return !deadline.IsZero() && !r.now().Before(deadline) }
	if gone() {
		return nil, errGaveUp
	}
	host := req.ClientInformation.Host
	refuse := func(reason string, err error) ([]byte, error) {
		r.refused.WithLabelValues(reason).Inc()
		r.log.Warn("bus connection refused", "reason", reason, "client_host", host, "client_name", req.ClientInformation.Name, "error", err)
		return policy.Refuse(r.issuer, req, reason)
	}
	if req.ClientInformation.Kind == policy.LeafClientKind {
		return r.decideNode(req, refuse)
	}
	chain, cerr := presented(req.TLS)
	byCert := (len(chain) > 0 || cerr != nil) && r.certs != nil
	caller, reason, err := r.byToken(req.ConnectOptions.Token)
	switch {
	case err == nil || !byCert:
		byCert = false
	case cerr != nil:
		reason, err = ReasonBadCert, cerr
	default:
		if reason != ReasonNoToken {
			r.log.Debug("bus token refused, trying the client certificate", "reason", reason, "client_host", host, "error", err)
		}
		caller, reason, err = r.byCert(chain)
	}
	if err != nil {
		return refuse(reason, err)
	}
	// The claim is "<namespace>/<name>" (bus.Config.AsPod), compared as it is: a
	// bare name is no claim to the default namespace's pod.
	if claim := req.ConnectOptions.Username; claim != "" && claim != caller.Pod.String() {
		return refuse(ReasonPodMismatch, fmt.Errorf("the connection claims pod %q, its credential proves pod %q (%s)", claim, caller.Pod, caller.ID))
	}
	// Checking the credential may have taken long (a TokenReview): admit nothing,
	// and count no admission, for a client the server has given up on.
	if gone() {
		return nil, errGaveUp
	}
	resp, reason, err := r.admit(req, caller)
	if err != nil {
		return refuse(reason, err)
	}
	r.admitted.Inc()
	if byCert {
		r.admittedByCert.Inc()
	}
	r.log.Debug("bus connection admitted", "pod", caller.Pod, "identity", caller.ID.String(), "credential", caller.Source, "client_host", host, "credential_expires", caller.Expires)
	return resp, nil
}

// byToken authenticates a connection by its connect token: a valid, pod-bound
// token with an expiry. On failure it returns the refusal's reason.
func (r *Responder) byToken(token string) (authn.Caller, string, error) {
	if token == "" {
		return authn.Caller{}, ReasonNoToken, errors.New("no token, and no credential the server knows")
	}
	if r.verify == nil {
		return authn.Caller{}, ReasonBadToken, errors.New("this signer verifies no tokens (no -jwks-file, -jwks-url, discovery or -token-review)")
	}
	// Before its keys are loaded every token would look signed by an unknown key:
	// say what it is, so that the pod's retry is expected, not an alarm.
	if err := r.verify.Ready(); err != nil {
		return authn.Caller{}, ReasonNotReady, fmt.Errorf("signer not ready to check tokens: %w", err)
	}
	now := r.now()
	if caller, ok := r.tokens.get(token, now); ok {
		r.cacheHits.Inc()
		return caller, "", nil
	}
	caller, err := r.verify.Verify(token)
	if errors.Is(err, authn.ErrUnavailable) {
		return authn.Caller{}, ReasonUnavailable, err
	}
	if err != nil {
		return authn.Caller{}, ReasonBadToken, err
	}
	if caller.Pod.IsZero() {
		return authn.Caller{}, ReasonNotPodBound, fmt.Errorf("token of %s names no pod (kubernetes.io.pod.name)", caller.ID)
	}
	if caller.Expires.IsZero() || !caller.Expires.After(now) {
		return authn.Caller{}, ReasonBadToken, errors.New("token has no usable expiry")
	}
	r.tokens.put(token, caller, now)
	return caller, "", nil
}

// admit grants the pod its own subjects and its identity sign subject
// (meshagent.rpc.sign.id.<ns>.<sa>.<name>), computed from the credential just verified:
// nats-server then lets no other connection publish there, so a signer run with
// -bus-sign-id reads the identity from the subject instead of verifying the token
// again per request. On failure it returns the refusal's reason.
func (r *Responder) admit(req *jwt.AuthorizationRequestClaims, caller authn.Caller) ([]byte, string, error) {
	_, ns, sa, err := pki.ParseWorkloadID(caller.ID.String())
	if err != nil {
		return nil, ReasonBadToken, err
	}
	// The pod's namespace is the credential's (authn takes it from the token; a
	// record from the token that was signed for): never another's.
	if caller.Pod.Namespace != ns {
		return nil, ReasonPodMismatch, fmt.Errorf("pod %s is not in the namespace of identity %s", caller.Pod, caller.ID)
	}
	if _, err := events.IdentitySignSubject(caller.Pod, sa); err != nil {
		return nil, ReasonNotSubjectSafe, err
	}
	now := r.now()
	expires := r.userExpiry(now, caller)
	if !r.admissions.take(admissionKey(caller), now, r.limits.Lifetime, r.limits.MaxAdmissions) {
		return nil, ReasonTooManyConnections, fmt.Errorf("pod %s had %d connections admitted within %s already", caller.Pod, r.limits.MaxAdmissions, r.limits.Lifetime)
	}
	resp, err := policy.AdmitPodIdentityLimited(r.issuer, req, caller.Pod, sa, expires, r.limits)
	if err != nil {
		return nil, ReasonBadToken, err
	}
	return resp, "", nil
}
