// Package backoff is the one schedule of waits between retries that meshagent's
// services share: a first wait doubling to a cap, jittered so that replicas or pods
// that failed together do not retry together, waited on the injected clock.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
)

// Policy is a retry schedule.
type Policy struct {
	First time.Duration // the wait after the first failure
	Max   time.Duration // the cap the doubling stops at
	// Jitter is the random part of each wait, from 0 (none: exactly the schedule)
	// to 1 (anything from 0 to the schedule's wait). 0.5 waits between half and all
	// of it, which keeps the schedule's pace while spreading a crowd.
	Jitter float64
}

// Backoff walks a Policy: each Next is the wait before the next attempt.
type Backoff struct {
	p   Policy
	cur time.Duration
}

// Start returns the schedule at its first wait.
func (p Policy) Start() *Backoff { return &Backoff{p: p, cur: p.First} }

// Next returns the wait before the next attempt, jittered, and doubles the
// schedule for the one after, up to Max.
func (b *Backoff) Next() time.Duration {
	d := b.p.Apply(b.cur)
	b.cur = min(2*b.cur, b.p.Max)
	return d
}

// Current is the schedule's next wait before jitter.
func (b *Backoff) Current() time.Duration { return b.cur }

// Reset starts the schedule over, after a success or a new chance.
func (b *Backoff) Reset() { b.cur = b.p.First }

// Apply jitters d as the policy says: a wait in [d*(1-Jitter), d].
func (p Policy) Apply(d time.Duration) time.Duration {
	j := min(max(p.Jitter, 0), 1)
	if d <= 0 || j == 0 {
		return max(d, 0)
	}
	spread := time.Duration(float64(d) * j)
	return d - spread + rand.N(spread+1)
}

// Wait waits d on clk, and reports false if ctx ended first.
func Wait(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
