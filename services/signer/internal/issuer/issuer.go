// Package issuer is the transport-independent core of the signer: it checks a
// request, authenticates the caller, signs the CSR's key for the caller's SPIFFE ID
// and records the certificate with a cert.issued event. It takes the one request
// type, events.SignRequest: the NATS front end passes on what it decoded, the gRPC
// front end maps Istio's request onto it; each adds what its transport proved (Via).
package issuer

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/nats-io/nats.go"
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

// TrustDomain is the mesh's trust domain, which bundle endorsements name.
func (i *Issuer) TrustDomain() string { return i.cfg.TrustDomain }

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
