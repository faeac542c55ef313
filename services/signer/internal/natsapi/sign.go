package natsapi

import (
	"context"
	"errors"
	"fmt"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
	"github.com/nats-io/nats.go"
)

// sign answers one sign request, in the compact encoding the sign subjects carry
// (pkg/events/sign_compact.go): refusals at once, a certificate once its
// cert.issued is stored; settle runs once it is answered or given up.
func (a *API) sign(ctx context.Context, m *nats.Msg, settle func()) {
	async := false
	defer func() {
		if !async {
			settle()
		}
	}()
	req, enc, err := events.DecodeSignRequest(m)
	if err == nil && enc != events.EncodingCompact {
		// One encoding per subject: the sign subjects carry the compact form.
		err = fmt.Errorf("%w: sign subjects take the compact encoding, not a CloudEvent", events.ErrInvalid)
	}
	if err != nil {
		a.iss.Malformed(issuer.TransportNATS, errors.Is(err, events.ErrTooLarge))
		a.respondSign(m, events.SignReply{Error: &events.ReplyError{Code: decodeCode(err), Message: err.Error()}})
		return
	}
	subject := m.Subject
	if sign, _, ok := events.SignSubjectOfReplica(subject); ok {
		subject = sign // sent to this replica by name: the same request
	}
	via, ok := a.signVia(subject)
	if !ok {
		a.respondSign(m, events.SignReply{Error: &events.ReplyError{Code: events.CodeInvalidArgument, Message: "not a sign subject: " + m.Subject}})
		return
	}
	if !req.Deadline.IsZero() {
		// Past its requester's deadline nothing is signed (the issuer drops it) and
		// no cert.issued is waited for: nobody would receive the certificate.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	a.recording.Add(1)
	async = true
	a.iss.IssueThen(ctx, req, via, a.pub, func(res issuer.Result, err error) {
		defer a.recording.Done()
		defer settle()
		var ie *issuer.Error
		switch {
		case errors.As(err, &ie) && ie.Code == events.CodeDeadlineExceeded:
			// Its requester stopped waiting: nobody reads a reply.
		case err != nil:
			a.respondSign(m, events.SignReply{Error: replyError(err)})
		default:
			a.respondCompact(m, res)
		}
	})
}

// respondSign sends rep, a refusal, in the compact encoding.
func (a *API) respondSign(req *nats.Msg, rep events.SignReply) {
	if req.Reply == "" {
		return
	}
	m, err := events.NewSignReplyMsg(req.Reply, events.EncodingCompact, a.iss.Source(), rep)
	if err != nil {
		a.log.Error("encode reply failed", "type", rep.EventType(), "encoding", events.EncodingCompact, "error", err)
		return
	}
	if err := a.nc.PublishMsg(m); err != nil {
		a.log.Warn("send reply failed", "error", err)
	}
}

// replyTail is the encoded end of compact sign replies for leaves signed with
// signing, carrying bundle's trust bundle (and, for a named signer, its roots as
// bundle endorsed them).
type replyTail struct {
	signing, bundle *ca.Material
	signer          *events.SignerRoots
	tail            events.SignReplyTail
}

// respondCompact sends res as a compact reply: the leaf, then the chain above it
// and the bundle, encoded (and checked) once per CA material.
func (a *API) respondCompact(req *nats.Msg, res issuer.Result) {
	if req.Reply == "" {
		return
	}
	t := a.tail.Load()
	if t == nil || t.signing != res.Signing || t.bundle != res.Bundle || t.signer != res.Signer {
		tail, err := events.NewSignReplyTail(res.Signing.ChainPEMs(), res.Bundle.RootPEMs(), a.trustDomain, res.Bundle.Generation, res.Bundle.Endorsements(), res.Signer)
		if err != nil {
			a.log.Error("encode reply failed", "type", events.TypeSignReply, "encoding", events.EncodingCompact, "error", err)
			a.respondSign(req, events.SignReply{Error: &events.ReplyError{Code: events.CodeInternal, Message: "encode reply: " + err.Error()}})
			return
		}
		t = &replyTail{signing: res.Signing, bundle: res.Bundle, signer: res.Signer, tail: tail}
		a.tail.Store(t)
	}
	m, err := events.NewCompactSignReply(req.Reply, res.Leaf.Raw, t.tail)
	if err != nil {
		a.log.Error("encode reply failed", "type", events.TypeSignReply, "encoding", events.EncodingCompact, "error", err)
		return
	}
	if err := a.nc.PublishMsg(m); err != nil {
		a.log.Warn("send reply failed", "error", err)
	}
}
