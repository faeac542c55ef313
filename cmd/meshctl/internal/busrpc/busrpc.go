// Package busrpc is meshctl's request-reply calls on the bus: a request of any
// payload, a sign request in the sign subjects' one encoding, and a root
// rotation. The operator's commands (cli) and the load generators (loadgen) both
// ask through it.
package busrpc

import (
	"context"
	"fmt"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

// Call sends req on subject as meshctl and decodes the reply as Rep; what names
// the request in errors. The reply's own error field is the caller's to read.
func Call[Rep events.Payload](ctx context.Context, nc *nats.Conn, subject string, req events.Payload, what string) (Rep, error) {
	var rep Rep
	msg, err := events.NewMsg(subject, "meshctl", req)
	if err != nil {
		return rep, err
	}
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return rep, fmt.Errorf("%s: %w", what, err)
	}
	if rep, _, err = events.Decode[Rep](resp); err != nil {
		return rep, fmt.Errorf("%s reply: %w", what, err)
	}
	return rep, nil
}

// Sign sends req on a sign subject in its one encoding (compact) and decodes the
// reply. The reply's own error field is the caller's to read.
func Sign(ctx context.Context, nc *nats.Conn, subject string, req events.SignRequest, what string) (events.SignReply, error) {
	msg, err := events.NewSignRequestMsg(subject, events.EncodingCompact, "meshctl", req)
	if err != nil {
		return events.SignReply{}, err
	}
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return events.SignReply{}, fmt.Errorf("%s: %w", what, err)
	}
	rep, _, err := events.DecodeSignReply(resp)
	if err != nil {
		return rep, fmt.Errorf("%s reply: %w", what, err)
	}
	return rep, nil
}

// RotateRoot asks the signers to rotate the root (or, with req.DryRun, for the
// plan); a refusal is an error.
func RotateRoot(ctx context.Context, nc *nats.Conn, req events.RotateRequest) (events.RotateReply, error) {
	reply, err := Call[events.RotateReply](ctx, nc, events.SubjectRootRotate, req, "rotate root")
	if err != nil {
		return events.RotateReply{}, err
	}
	if reply.Error != nil {
		return events.RotateReply{}, fmt.Errorf("signer refused: %w", reply.Error)
	}
	return reply, nil
}
