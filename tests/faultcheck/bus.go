package faultcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ForceRenew tells pod to renew its `default` certificate now, as `meshctl rotate
// pod` does (a core publish: lost if no sds-edge listens at the moment).
func ForceRenew(nc *nats.Conn, pod events.PodRef) error {
	subj, err := events.PodRenewSubject(pod)
	if err != nil {
		return err
	}
	msg, err := events.NewMsg(subj, "faultcheck", events.RenewDue{Pod: pod, Resource: "default", Reason: events.RenewForced})
	if err != nil {
		return err
	}
	return nc.PublishMsg(msg)
}

// Bundle asks the signers for the trust bundle once.
func Bundle(ctx context.Context, nc *nats.Conn) (events.BundleReply, error) {
	req, err := events.NewMsg(events.SubjectTrustBundle, "faultcheck", events.BundleRequest{})
	if err != nil {
		return events.BundleReply{}, err
	}
	resp, err := nc.RequestMsgWithContext(ctx, req)
	if err != nil {
		return events.BundleReply{}, err
	}
	b, _, err := events.Decode[events.BundleReply](resp)
	switch {
	case err != nil:
		return b, err
	case b.Error != nil:
		return b, b.Error
	case len(b.Roots) == 0:
		return b, errors.New("trust bundle without roots")
	}
	return b, nil
}

// EventStream is the event stream's current info, asked in one short attempt.
func EventStream(nc *nats.Conn) (*jetstream.StreamInfo, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return nil, err
	}
	return st.Info(ctx)
}

// StreamWhole reports whether the event stream has a leader and peers current
// replicas besides it (2 for an R3 stream with every node up).
func StreamWhole(nc *nats.Conn, peers int) error {
	info, err := EventStream(nc)
	if err != nil {
		return err
	}
	c := info.Cluster
	if c == nil || c.Leader == "" {
		return errors.New("event stream has no leader")
	}
	if len(c.Replicas) != peers {
		return fmt.Errorf("event stream has %d replicas besides its leader, want %d", len(c.Replicas), peers)
	}
	for _, r := range c.Replicas {
		if !r.Current || r.Offline {
			return fmt.Errorf("replica %s is not current", r.Name)
		}
	}
	return nil
}
