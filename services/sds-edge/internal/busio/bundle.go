package busio

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
)

// FetchBundle asks a signer for the current trust bundle (events.SubjectTrustBundle).
func FetchBundle(ctx context.Context, nc *nats.Conn, source string) (events.BundleReply, error) {
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

// OnReconnect adds fn to nc's reconnect handler, keeping the one already set.
func OnReconnect(nc *nats.Conn, fn func()) {
	prev := nc.Opts.ReconnectedCB
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		fn()
	})
}
