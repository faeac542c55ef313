package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Retry bounds. A JetStream cluster that is still electing its meta leader (a cold
// start, a lost leader) leaves API requests unanswered: one long request outlasts
// the moment it can answer, many short ones catch it.
const (
	// AttemptTimeout bounds one attempt of Retry.
	AttemptTimeout = 3 * time.Second
	// retryLogEvery is how often a long wait is logged again at INFO.
	retryLogEvery = 10 * time.Second
)

// Retry calls op until it returns nil, giving each call at most AttemptTimeout (a
// third of it the first time, two thirds the second: attemptLimit) and
// waiting with backoff (retrySchedule) between calls, for as long as op
// fails with a Transient error (or one wrapped by Pending) and ctx lasts. Any other
// error is returned at once. what names what is waited for, in logs and errors
// ("event stream MESHAGENT_EVENTS"). The first failure is logged at INFO, then
// every 10 s; a success after waiting is logged at INFO with the time it took.
// The waits and the times logged are clk's.
func Retry(ctx context.Context, clk clock.Clock, log hclog.Logger, what string, op func(ctx context.Context) error) error {
	start := clk.Now()
	bo := retrySchedule.Start()
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptLimit(attempt))
		err := op(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info("jetstream ready", "for", what, "waited", clk.Now().Sub(start).Round(time.Millisecond), "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (after %d attempts in %s; last error: %v)", what, ctx.Err(), attempt, clk.Now().Sub(start).Round(time.Millisecond), err)
		}
		if !Transient(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if now := clk.Now(); now.Sub(lastLog) >= retryLogEvery {
			log.Info("waiting for jetstream", "for", what, "attempts", attempt, "waited", now.Sub(start).Round(time.Millisecond), "error", err)
			lastLog = now
		} else {
			log.Debug("jetstream attempt failed, retrying", "for", what, "attempt", attempt, "error", err)
		}
		if !backoff.Wait(ctx, clk, bo.Next()) {
			return fmt.Errorf("%s: %w (after %d attempts in %s; last error: %v)", what, ctx.Err(), attempt, clk.Now().Sub(start).Round(time.Millisecond), err)
		}
	}
}

// OpenWatch opens a KV watch with open, retried as Retry retries while JetStream is away
// or slow. A watch is an ephemeral consumer made in one API request: on a loaded cluster
// just after a node loss that request can outlast nats.go's timeout, and a service that
// exited on it (the only signer of a CI run did) took its part of the fleet down with a
// transient. nats.go ends a watch with the context it was opened with, so every attempt
// gets ctx itself and is bounded by nats.go's request timeout, not by Retry's attempts.
func OpenWatch(ctx context.Context, clk clock.Clock, log hclog.Logger, what string, open func(context.Context) (jetstream.KeyWatcher, error)) (jetstream.KeyWatcher, error) {
	var w jetstream.KeyWatcher
	err := Retry(ctx, clk, log, what, func(context.Context) error {
		var err error
		w, err = open(ctx)
		return err
	})
	return w, err
}

// retrySchedule is the wait between attempts: 100 ms doubling to 1 s, jittered so
// that the replicas a cold cluster start holds up do not ask again together.
var retrySchedule = backoff.Policy{First: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}

// attemptTimeout is AttemptTimeout; tests shorten it.
var attemptTimeout = AttemptTimeout

// attemptLimit bounds attempt n (from 1): a third of attemptTimeout for the
// first, growing by as much each attempt up to attemptTimeout. A request lost to
// an election (a cold cluster start) then costs a second, not three, while a
// request that needs longer still gets its time from the third attempt on.
func attemptLimit(n int) time.Duration {
	return min(attemptTimeout, time.Duration(n)*attemptTimeout/3)
}

// pending marks an error as a state that is expected to pass.
type pending struct{ err error }

func (p pending) Error() string { return p.err.Error() }
func (p pending) Unwrap() error { return p.err }

// Pending marks err as a state expected to pass (a stream another service creates,
// not there yet), so that Retry retries it.
func Pending(err error) error {
	if err == nil {
		return nil
	}
	return pending{err}
}

// Transient reports whether err is one that JetStream gives while it cannot answer
// yet or for a moment: no answer in time, no responder (JetStream not up on this
// server yet), the connection reconnecting, a cluster without a meta or stream
// leader, or without enough peers for the asked replicas yet. Errors about the
// request itself (a bad config, a stream of another shape, a refused permission)
// are not.
func Transient(err error) bool {
	var p pending
	if errors.As(err, &p) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) ||
		// jetstream reports no responder on its API as "not enabled": on a server
		// that has JetStream configured, that is a server still starting it.
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case 10005, // no suitable peers for placement: the cluster has not met all its nodes yet
			10008, // JetStream system temporarily unavailable: no meta leader
			10009, // cluster can not handle request: not the leader
			10023, // insufficient resources: peers not known yet
			10118: // stream offline: no stream leader
			return true
		}
		return api.Code == 503
	}
	return false
}
