// Package caclient sends sds-edge's signing requests to a certificate authority:
// the signer over NATS request-reply (NATS), or an Istio-compatible CA over gRPC
// (Istio, for CA_ADDR). Both take the one request type, events.SignRequest, and
// return the reply unchecked: the caller, which owns the key and knows the pod's
// identity and trust, decides whether to believe it.
package caclient

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/trustbundle"
)

// Response is a signed chain, leaf first and root last, and the trust bundle that
// came with it. Neither is checked or trusted yet.
type Response struct {
	ChainPEM []string
	// Bundle is the reply's trust bundle. Endorsed is false when the CA sends none
	// (Istio's CreateCertificate): Bundle then holds only the chain's last
	// certificate, which vouches for nothing.
	Bundle   trustbundle.Bundle
	Endorsed bool
}

// ErrRejected wraps a definite refusal by the CA (bad token, bad CSR): retrying the
// same request will not help, though a fresh token may.
var ErrRejected = errors.New("rejected by ca")

// NATS asks the signer over NATS request-reply on the pod sign subject
// (events.PodSignSubject), or events.SubjectSignAny for a caller that is no pod.
type NATS struct {
	nc     *nats.Conn
	source string
}

// NewNATS returns a signer client on nc; source names this pod in event envelopes.
func NewNATS(nc *nats.Conn, source string) *NATS { return &NATS{nc: nc, source: source} }

// Sign sends req and waits for the reply until ctx ends.
func (n *NATS) Sign(ctx context.Context, req events.SignRequest) (Response, error) {
	subject := events.SubjectSignAny
	if req.Pod != "" {
		s, err := events.PodSignSubject(req.Pod)
		if err != nil {
			return Response{}, fmt.Errorf("build sign request: %w", err)
		}
		subject = s
	}
	msg, err := events.NewMsg(subject, n.source, req)
	if err != nil {
		return Response{}, fmt.Errorf("build sign request: %w", err)
	}
	reply, err := n.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return Response{}, fmt.Errorf("sign request: %w", err)
	}
	r, _, err := events.Decode[events.SignReply](reply)
	if err != nil {
		return Response{}, fmt.Errorf("sign reply: %w", err)
	}
	if r.Error != nil {
		if r.Error.Code == events.CodeUnavailable || r.Error.Code == events.CodeResourceExhausted || r.Error.Code == events.CodeInternal {
			return Response{}, fmt.Errorf("signer: %w", r.Error)
		}
		return Response{}, fmt.Errorf("%w: %w", ErrRejected, r.Error)
	}
	if len(r.Roots) == 0 {
		return Response{}, errors.New("sign reply without roots")
	}
	return Response{ChainPEM: r.CertChain, Bundle: trustbundle.FromSignReply(r), Endorsed: true}, nil
}
