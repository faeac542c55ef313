package natsapi

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

// The sign requests' way in: the subscriptions' handler, the waiting room's
// verdict (room.go), and the accounting of what is in flight.

// TurnedAway counts sign requests answered "busy, ask again at your slot" by the
// waiting room instead of queued.
func (a *API) TurnedAway() uint64 { return a.turnedAway.Load() }

// Pace is the sign requests the workers finish per second, as the waiting room
// last measured it with a queue to work from.
func (a *API) Pace() float64 {
	if a.room == nil {
		return 0
	}
	return a.room.pace()
}

// intake is the sign subscriptions' handler: it queues a request the waiting room
// admits, and answers any other at once with its slot to come back at. NATS runs
// it on the subscription's own goroutine, which does nothing else, so the reading
// of requests keeps up with a storm however far behind the workers are.
func (a *API) intake(signs chan *nats.Msg) nats.MsgHandler {
	return func(m *nats.Msg) {
		a.intakeMu.RLock()
		defer a.intakeMu.RUnlock()
		if a.intakeClosed {
			return
		}
		now := a.clk.Now()
		deadline, _ := events.SignRequestDeadline(m)
		if a.room.admit(a.ahead(), deadline, now) {
			a.inflight.Add(1)
			select {
			case signs <- m:
				return
			default:
				a.inflight.Add(-1)
			}
		}
		a.turnAway(m, a.room.slot(a.ahead(), now))
	}
}

// busyMessage is a turned-away request's refusal.
const busyMessage = "signer busy: its queue holds what it can answer in time; ask again after retry_after_ms, the slot given"

// ahead is what a sign request arriving now would wait behind: the requests
// admitted and not yet answered, queued for a worker or signed and waiting for
// their cert.issued to be stored (an answer leaves only then).
func (a *API) ahead() int { return int(a.inflight.Load()) }

// serveSign answers one admitted sign request and, once it is answered (or left
// unanswered), counts it done for the waiting room's pace — from admission to
// answer, the store of its record included.
func (a *API) serveSign(base context.Context, m *nats.Msg) {
	var once sync.Once
	settle := func() {
		once.Do(func() {
			a.room.done(int(a.inflight.Add(-1)), a.clk.Now())
		})
	}
	served := false
	a.serve(base, func(ctx context.Context, m *nats.Msg) {
		served = true
		a.sign(ctx, m, settle)
	}, m)
	if !served {
		settle()
	}
}

// turnAway answers a sign request the queue has no room for: busy, ask again
// after wait. Like every answer, only to the requester's own inbox.
func (a *API) turnAway(m *nats.Msg, wait time.Duration) {
	if !replyAllowed(m.Reply) || !replyToRequester(m.Subject, m.Reply) {
		a.refused.Add(1)
		return
	}
	a.turnedAway.Add(1)
	wait = max(wait, time.Millisecond)
	// One message for every refusal (the numbers are in retry_after_ms and the
	// metrics): a crowd's refusals read as one kind of error.
	a.respondSign(m, events.SignReply{Error: &events.ReplyError{Code: events.CodeUnavailable,
		Message: busyMessage, RetryAfterMillis: uint64(wait / time.Millisecond)}})
}

// signPending bounds what a sign subscription holds before intake has read it: a
// storm's whole wave (100,000 requests of about a kilobyte), which intake reads
// faster than NATS delivers it; beyond, NATS drops (slow consumer).
const signPending = 256 << 20

// subscribeSigns keeps a sign subscription, with signPending's bound.
func (a *API) subscribeSigns(sub *nats.Subscription, err error) error {
	if err != nil {
		return err
	}
	if err := sub.SetPendingLimits(-1, signPending); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("pending limits %s: %w", sub.Subject, err)
	}
	return a.subscribed(sub, nil)
}
