// Package caclient sends sds-edge's signing requests to a certificate authority:
// the signer over NATS request-reply (NATS), an Istio-compatible CA over gRPC
// (Istio, for CA_ADDR), or the bus with gRPC CAs when the bus is unreachable or
// slow (Fallback, for CA_FALLBACK_ADDR). Both take the one request type, events.SignRequest, and
// return the reply unchecked: the caller, which owns the key and knows the pod's
// identity and trust, decides whether to believe it.
package caclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/clock"
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
	// Vouched is, over Istio's gRPC API, the CA's whole trust bundle from the
	// response header events.TrustBundleHeader (a meshagent signer sends it;
	// Istio's CA does not: nil). Unchecked here; Whole is set.
	Vouched *trustbundle.Bundle
	// Signer is, for a named signer's chain, that signer's roots as the mesh CA
	// endorsed them (events.SignerRoots): on the bus in the reply, over Istio's
	// gRPC API in a response header (events.SignerRootsHeader). Unchecked here.
	Signer *events.SignerRoots
}

// ErrRejected wraps a definite refusal by the CA (bad token, bad CSR): retrying the
// same request will not help, though a fresh token may.
var ErrRejected = errors.New("rejected by ca")

// ErrUnreachable wraps a failure to reach any CA on a path (no signer on the bus,
// the bus not connected, the gRPC CA refusing connections): nothing was signed or
// refused, and trying again, or another path, costs the CA nothing.
var ErrUnreachable = errors.New("ca unreachable")

// NATS asks the signer over NATS request-reply in the compact encoding (the one
// encoding of the sign subjects) — in the signer queue group, and when that does not
// answer in half the time, once more at a live replica by name (see ask) — on the
// pod's identity sign subject
// (events.IdentitySignSubject) when the bus auth callout admitted the connection by
// the pod's credential (NewNATSAs) — a signer run with -bus-sign-id takes the
// identity from that subject, any other verifies the token the request carries —
// else on the pod sign subject (events.PodSignSubject), or events.SubjectSignAny for
// a caller that is no pod.
type NATS struct {
	nc     *nats.Conn
	source string
	sa     string // the service account the callout admitted the connection as; "" if none
	node   string // the node whose tier the connection goes through; "" if none
}

// NewNATS returns a signer client on nc; source names this pod in event envelopes.
func NewNATS(nc *nats.Conn, source string) *NATS { return &NATS{nc: nc, source: source} }

// NewNATSAs is NewNATS for a connection the bus auth callout admitted by the pod's
// token, which proves the pod's namespace (the request's pod's) and service
// account sa.
func NewNATSAs(nc *nats.Conn, source, sa string) *NATS {
	return &NATS{nc: nc, source: source, sa: sa}
}

// NewNATSVia is NewNATS for a pod that reaches the bus through node's tier (its
// node agent admitted the connection): requests go on the node sign subject
// (events.NodeSignSubject), with the pod's token, which the signer verifies and
// whose node claim must be node.
func NewNATSVia(nc *nats.Conn, source, node string) *NATS {
	return &NATS{nc: nc, source: source, node: node}
}

// Sign sends req and waits for the reply until ctx ends; ctx's deadline travels
// with the request (events.SignRequest.Deadline).
func (n *NATS) Sign(ctx context.Context, req events.SignRequest) (Response, error) {
	subject, err := n.subject(req.Pod)
	if err != nil {
		return Response{}, fmt.Errorf("build sign request: %w", err)
	}
	if !n.nc.IsConnected() {
		// A request now would wait out ctx in the reconnect buffer.
		return Response{}, fmt.Errorf("sign request: %w: bus not connected (%s)", ErrUnreachable, n.nc.Status())
	}
	r, err := n.ask(ctx, subject, req)
	if errors.Is(err, nats.ErrNoResponders) {
		return Response{}, fmt.Errorf("sign request: %w: %w", ErrUnreachable, err)
	}
	if err != nil {
		return Response{}, err
	}
	if r.Error != nil {
		switch r.Error.Code {
		case events.CodeUnavailable, events.CodeResourceExhausted, events.CodeInternal, events.CodeDeadlineExceeded:
			return Response{}, fmt.Errorf("signer: %w", r.Error)
		}
		return Response{}, fmt.Errorf("%w: %w", ErrRejected, r.Error)
	}
	if len(r.Roots) == 0 {
		return Response{}, errors.New("sign reply without roots")
	}
	return Response{ChainPEM: r.CertChain, Bundle: trustbundle.FromSignReply(r), Endorsed: true, Signer: r.Signer}, nil
}

// subject is where a request for pod goes (see NATS).
func (n *NATS) subject(pod events.PodRef) (string, error) {
	switch {
	case pod.IsZero():
		return events.SubjectSignAny, nil
	case n.node != "":
		return events.NodeSignSubject(n.node, pod)
	case n.sa != "":
		return events.IdentitySignSubject(pod, n.sa)
	default:
		return events.PodSignSubject(pod)
	}
}

// ask sends req on subject, in the signer queue group, with half the time ctx
// leaves. When that half runs out unanswered — nats-server may hand the request
// to a frozen member, which keeps its share until its node drops it for missed
// pings — it asks which signer replicas answer now (events.SubjectSignerPing) and
// sends req straight to the first that did, with the rest of the time. A pod's
// request only: its bus permissions include its sign subject's replica form.
func (n *NATS) ask(ctx context.Context, subject string, req events.SignRequest) (events.SignReply, error) {
	if req.Pod.IsZero() {
		return n.askOn(ctx, subject, req)
	}
	qctx, cancel := share(ctx, 2)
	r, err := n.askOn(qctx, subject, req)
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return r, err
	}
	replica, perr := n.liveReplica(ctx)
	if perr != nil {
		return r, fmt.Errorf("%w; then no signer replica answered the ping: %w", err, perr)
	}
	direct, derr := events.ReplicaSignSubject(replica, subject)
	if derr != nil {
		return r, fmt.Errorf("%w; then: %w", err, derr)
	}
	r, err = n.askOn(ctx, direct, req)
	if err != nil {
		return r, fmt.Errorf("sign request at signer replica %s, after the queue group timed out: %w", replica, err)
	}
	return r, nil
}

// pingShare is the part of the time left that the replica ping may take: a live
// replica answers it at once, from its read loop.
const pingShare = 4

// liveReplica asks every signer replica for its name and returns the first answer.
func (n *NATS) liveReplica(ctx context.Context) (string, error) {
	msg, err := events.NewMsg(events.SubjectSignerPing, n.source, events.SignerPing{})
	if err != nil {
		return "", err
	}
	pctx, cancel := share(ctx, pingShare)
	defer cancel()
	reply, err := n.nc.RequestMsgWithContext(pctx, msg)
	if err != nil {
		return "", err
	}
	pong, _, err := events.Decode[events.SignerPong](reply)
	if err != nil {
		return "", fmt.Errorf("ping reply: %w", err)
	}
	return pong.Replica, nil
}

// askOn sends req on subject once and decodes the reply. ctx's deadline travels
// with the request: the signer drops it unsigned once we have stopped waiting (a
// replica frozen while holding it, answering when it resumes).
func (n *NATS) askOn(ctx context.Context, subject string, req events.SignRequest) (events.SignReply, error) {
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = d
	}
	msg, err := events.NewSignRequestMsg(subject, events.EncodingCompact, n.source, req)
	if err != nil {
		return events.SignReply{}, fmt.Errorf("build sign request: %w", err)
	}
	reply, err := n.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return events.SignReply{}, fmt.Errorf("sign request: %w", err)
	}
	r, _, err := events.DecodeSignReply(reply)
	if err != nil {
		return events.SignReply{}, fmt.Errorf("sign reply: %w", err)
	}
	return r, nil
}

// Fallback signs on the bus (Bus) while it is connected and a signer answers
// there in time, and over the CAs' gRPC API (GRPC, tried in turn) otherwise: a pod
// cut off the bus, or on a bus whose signers do not answer (a frozen replica, a
// partition behind a connected node), still renews. All take the same
// events.SignRequest; a CA's refusal is final for the attempt (the others would
// refuse it too).
type Fallback struct {
	Bus  *NATS
	GRPC []*Istio
}

// Sign tries the bus with half the time ctx leaves, then, when the bus is
// unreachable or did not answer in that time, each gRPC CA in turn with an equal
// share of what is left, moving on from one that is unreachable or times out.
func (f Fallback) Sign(ctx context.Context, req events.SignRequest) (Response, error) {
	bctx, cancel := share(ctx, 2)
	resp, err := f.Bus.Sign(bctx, req)
	cancel()
	if err == nil || !retryElsewhere(ctx, err) {
		return resp, err
	}
	errs := fmt.Errorf("on the bus: %w", err)
	for i, g := range f.GRPC {
		gctx, cancel := share(ctx, len(f.GRPC)-i)
		resp, gerr := g.Sign(gctx, req)
		cancel()
		if gerr == nil {
			return resp, nil
		}
		errs = fmt.Errorf("%w; over gRPC at %s: %w", errs, g.addr, gerr)
		if !retryElsewhere(ctx, gerr) {
			break
		}
	}
	return Response{}, errs
}

// retryElsewhere reports whether err, from a try whose parent context is ctx,
// leaves the request for another path: nothing answered it (unreachable), or the
// try's own share of the time ran out while ctx still has some.
func retryElsewhere(ctx context.Context, err error) bool {
	if errors.Is(err, ErrUnreachable) {
		return true
	}
	timedOut := errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
	return timedOut && ctx.Err() == nil
}

// share is ctx with 1/n of the time it has left (ctx itself, cancellable, when it
// has no deadline). A context's deadline is kept on the wall clock, so what is
// left of it is measured there too, never on an injected clock.
func share(ctx context.Context, n int) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok || n <= 1 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d.Sub(clock.Real{}.Now())/time.Duration(n))
}
