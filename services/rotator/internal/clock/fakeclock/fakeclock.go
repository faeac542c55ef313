// Package fakeclock is a manually advanced clock.Clock for tests.
package fakeclock

import (
	"sync"
	"time"

	"github.com/meshagent/meshagent/services/rotator/internal/clock"
)

// Clock only moves when Advance or Set is called; timers whose deadline is reached
// fire then.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*timer]struct{}
}

var _ clock.Clock = (*Clock)(nil)

// New returns a clock set to start.
func New(start time.Time) *Clock {
	return &Clock{now: start, timers: map[*timer]struct{}{}}
}

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and fires every timer that is due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	var due []*timer
	for t := range c.timers {
		if !t.at.After(now) {
			due = append(due, t)
			delete(c.timers, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		select {
		case t.ch <- now:
		default:
		}
	}
}

// Timers returns how many timers are armed.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NewTimer returns a timer that fires when the clock reaches now+d.
func (c *Clock) NewTimer(d time.Duration) clock.Timer {
	t := &timer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

type timer struct {
	c  *Clock
	ch chan time.Time
	at time.Time
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, armed := t.c.timers[t]
	delete(t.c.timers, t)
	return armed
}

func (t *timer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	_, armed := t.c.timers[t]
	t.at = t.c.now.Add(d)
	fire := d <= 0
	if fire {
		delete(t.c.timers, t)
	} else {
		t.c.timers[t] = struct{}{}
	}
	now := t.c.now
	t.c.mu.Unlock()
	if fire {
		select {
		case t.ch <- now:
		default:
		}
	}
	return armed
}
