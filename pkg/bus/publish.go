package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PublishAttempt bounds the wait for one publish's ack (Publish).
const PublishAttempt = 2 * time.Second

// publishRetry is the wait between the attempts of one Publish: jittered, so that
// the pods that lost the stream together do not all come back at once.
var publishRetry = backoff.Policy{First: 50 * time.Millisecond, Max: time.Second, Jitter: 0.5}

// Publisher stores events in JetStream and waits for the stream's ack, retrying
// while the stream does not answer (a cluster electing a stream leader after a
// node loss, the bus reconnecting: Unanswered), until the caller's context ends. Each attempt waits at most PublishAttempt for
// its ack: a publish sent to a leader that just died is never acknowledged, and
// the next attempt reaches the new one. The event id is the dedup id, so a retry
// never stores an event twice. It is the one retrying publish: its callers bound
// it with their context and never retry around it.
type Publisher struct {
	JS jetstream.JetStream
	// Clock times the waits between attempts; nil: the wall clock.
	Clock clock.Clock
	// Retryable says which failed attempts are tried again; nil: Unanswered. The
	// outbox, which holds its queue through any passing trouble, gives Transient.
	Retryable func(err error) bool
	// Retrying, if set, hears each failed attempt that is tried again.
	Retrying func(err error)
}

// Publish sends msg (an event whose ce-id becomes its dedup id) and waits for the
// stream's ack, retrying as the Publisher's comment says.
func (p Publisher) Publish(ctx context.Context, msg *nats.Msg) error {
	clk := p.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	retryable := p.Retryable
	if retryable == nil {
		retryable = Unanswered
	}
	retry := publishRetry.Start()
	for {
		err := attempt(ctx, p.JS, msg)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil && !retryable(err) {
			return fmt.Errorf("publish %s: %w", msg.Subject, err)
		}
		if ctx.Err() == nil && p.Retrying != nil {
			p.Retrying(err)
		}
		if !backoff.Wait(ctx, clk, retry.Next()) {
			return fmt.Errorf("publish %s: %w (last error: %v)", msg.Subject, ctx.Err(), err)
		}
	}
}

// Unanswered reports whether a publish failed for want of an answer: no responder
// (no stream leader yet), no ack in time, the connection reconnecting. A stream
// that answers with a refusal (full, say) is not unanswered.
func Unanswered(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}

// attempt sends msg once and waits at most PublishAttempt for the stream's ack.
func attempt(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) error {
	actx, cancel := context.WithTimeout(ctx, PublishAttempt)
	defer cancel()
	_, err := js.PublishMsg(actx, msg, jetstream.WithMsgID(msg.Header.Get(events.HeaderID)))
	return err
}

// PublishOnce makes one attempt of Publish: it sends msg with its event id as the
// dedup id and waits at most PublishAttempt for the stream's ack. It is for a
// caller whose own loop is the retry (one that must give up an event for a newer
// one, as the signer's trust announcer does); anyone else calls Publish, and no
// one calls Publish inside a retry loop.
func PublishOnce(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) error {
	if err := attempt(ctx, js, msg); err != nil {
		return fmt.Errorf("publish %s: %w", msg.Subject, err)
	}
	return nil
}

// Publish stores msg in JetStream on the wall clock: Publisher{JS: js}.Publish.
func Publish(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) error {
	return Publisher{JS: js}.Publish(ctx, msg)
}
