package trustbundle

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
)

// Fetch asks a signer for the current trust bundle (events.SubjectTrustBundle);
// source names the caller in the request's envelope. The reply is not verified:
// give it to Set.Check.
func Fetch(ctx context.Context, nc *nats.Conn, source string) (events.BundleReply, error) {
	msg, err := events.NewMsg(events.SubjectTrustBundle, source, events.BundleRequest{})
	if err != nil {
		return events.BundleReply{}, err
	}
	reply, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return events.BundleReply{}, fmt.Errorf("trust bundle request: %w", err)
	}
	r, _, err := events.Decode[events.BundleReply](reply)
	if err != nil {
		return events.BundleReply{}, fmt.Errorf("trust bundle reply: %w", err)
	}
	if r.Error != nil {
		return events.BundleReply{}, fmt.Errorf("trust bundle: %w", r.Error)
	}
	return r, nil
}
