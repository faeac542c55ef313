package ca

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
)

// Announce retry bounds: each publish attempt gets announceAttempt, and failed
// attempts are retried after a backoff from announceMinBackoff doubling to
// announceMaxBackoff.
const (
	announceAttempt    = 10 * time.Second
	announceMinBackoff = 100 * time.Millisecond
	announceMaxBackoff = 10 * time.Second
)

// announcer publishes trust.changed for every bundle generation a replica sees that
// it does not know to be published yet, and retries until the bus acknowledges it or
// a newer generation supersedes it. Every replica that sees a change publishes it
// under the same event id (trust-<td>-<gen>), so JetStream keeps one copy.
//
// It is the one retry layer of trust.changed: its Notifier makes a single publish
// attempt (the signer's announceTrust), and the announcer retries it on its
// backoff, the wait on the injected clock.
type announcer struct {
	notify Notifier
	log    hclog.Logger
	clk    clock.Clock
	min    time.Duration
	max    time.Duration

	mu      sync.Mutex
	known   uint64 // highest generation known to be published (or that needs no event)
	pending *events.TrustChanged
	wake    chan struct{}

	failures atomic.Uint64
}

func newAnnouncer(notify Notifier, log hclog.Logger, clk clock.Clock) *announcer {
	return &announcer{notify: notify, log: log, clk: clk, min: announceMinBackoff, max: announceMaxBackoff, wake: make(chan struct{}, 1)}
}

// settle records gen as needing no event (the generation a replica starts on).
func (a *announcer) settle(gen uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.known = max(a.known, gen)
}

// Announced is the highest generation known to be published.
func (a *announcer) announced() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.known
}

// observe queues tc unless its generation is already published or queued.
func (a *announcer) observe(tc events.TrustChanged) {
	if a.notify == nil {
		return
	}
	a.mu.Lock()
	if tc.Generation <= a.known || (a.pending != nil && a.pending.Generation >= tc.Generation) {
		a.mu.Unlock()
		return
	}
	a.pending = &tc
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// run publishes queued events until ctx is done.
func (a *announcer) run(ctx context.Context) {
	bo := backoff.Policy{First: a.min, Max: a.max, Jitter: 0.5}.Start()
	var retry <-chan time.Time
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		case <-retry:
		}
		if timer != nil {
			timer.Stop()
			timer, retry = nil, nil
		}
		a.mu.Lock()
		p := a.pending
		a.mu.Unlock()
		if p == nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, announceAttempt)
		err := a.notify(actx, *p)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			a.failures.Add(1)
			wait := bo.Next()
			a.log.Warn("publish trust.changed failed, will retry", "generation", p.Generation, "retry_in", wait, "error", err)
			timer = a.clk.NewTimer(wait)
			retry = timer.C()
			continue
		}
		bo.Reset()
		a.log.Debug("trust.changed published", "generation", p.Generation, "reason", p.Reason)
		a.mu.Lock()
		a.known = max(a.known, p.Generation)
		if a.pending != nil && a.pending.Generation <= a.known {
			a.pending = nil
		}
		a.mu.Unlock()
	}
}
