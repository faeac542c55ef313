package ca

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/trustbundle"
)

// NATS asks the signer over NATS request-reply on the pod sign subject
// (events.PodSignSubject), or events.SubjectSignAny for a caller that is no pod.
type NATS struct {
	nc     *nats.Conn
	source string
}

var _ Signer = (*NATS)(nil)

// NewNATS returns a signer client on nc; source names this pod in event envelopes.
func NewNATS(nc *nats.Conn, source string) *NATS { return &NATS{nc: nc, source: source} }

// Sign sends req and waits for the reply until ctx ends.
func (n *NATS) Sign(ctx context.Context, req Request) (Response, error) {
	subject := events.SubjectSignAny
	if req.Pod != "" {
		s, err := events.PodSignSubject(req.Pod)
		if err != nil {
			return Response{}, fmt.Errorf("build sign request: %w", err)
		}
		subject = s
	}
	msg, err := events.NewMsg(subject, n.source, events.SignRequest{
		CSR: string(req.CSR), Token: req.Token, CertChain: req.CertChain, Proof: req.Proof,
		TTL: req.TTL, Pod: req.Pod, Resource: req.Resource, KeyAlgorithm: req.KeyAlgorithm,
	})
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
	chain, err := checkChain(r.CertChain, req.SPIFFEID)
	if err != nil {
		return Response{}, err
	}
	if len(r.Roots) == 0 {
		return Response{}, errors.New("sign reply without roots")
	}
	return Response{Chain: chain, ChainPEM: r.CertChain, Bundle: trustbundle.FromSignReply(r), Endorsed: true}, nil
}
