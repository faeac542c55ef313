package clock

import (
	"sync"
	"time"
)

// Fake is a clock that moves only when Add or Set is called; timers whose
// deadline is then reached fire. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{}
}

var _ Clock = (*Fake)(nil)

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, timers: map[*fakeTimer]struct{}{}}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Add moves the clock by d (backwards when d is negative) and fires every timer
// that is due.
func (f *Fake) Add(d time.Duration) {
	f.mu.Lock()
	f.set(f.now.Add(d))
}

// Set moves the clock to t and fires every timer that is due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.set(t)
}

// set is called with f.mu held and releases it before firing.
func (f *Fake) set(t time.Time) {
	f.now = t
	var due []*fakeTimer
	for tm := range f.timers {
		if !tm.at.After(t) {
			due = append(due, tm)
			delete(f.timers, tm)
		}
	}
	f.mu.Unlock()
	for _, tm := range due {
		tm.fire(t)
	}
}

// Timers returns how many timers are armed, so that a test can wait until the code
// under test has scheduled its next step before moving the clock.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NewTimer returns a timer that fires when the clock reaches now+d; at once when
// d <= 0.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

type fakeTimer struct {
	f  *Fake
	ch chan time.Time
	at time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

// fire delivers now unless a tick is already waiting, as a real timer does.
func (t *fakeTimer) fire(now time.Time) {
	select {
	case t.ch <- now:
	default:
	}
}

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	_, armed := t.f.timers[t]
	delete(t.f.timers, t)
	return armed
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	_, armed := t.f.timers[t]
	t.at = t.f.now.Add(d)
	now := t.f.now
	if d <= 0 {
		delete(t.f.timers, t)
	} else {
		t.f.timers[t] = struct{}{}
	}
	t.f.mu.Unlock()
	if d <= 0 {
		t.fire(now)
	}
	return armed
}
