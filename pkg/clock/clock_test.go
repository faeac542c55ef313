package clock

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

func fired(tm Timer) (time.Time, bool) {
	select {
	case at := <-tm.C():
		return at, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimersFireWhenTheClockReachesThem(t *testing.T) {
	tests := []struct {
		name  string
		after time.Duration
		move  func(f *Fake)
		want  bool
	}{
		{"add short of the deadline", time.Minute, func(f *Fake) { f.Add(59 * time.Second) }, false},
		{"add to the deadline", time.Minute, func(f *Fake) { f.Add(time.Minute) }, true},
		{"add past the deadline", time.Minute, func(f *Fake) { f.Add(time.Hour) }, true},
		{"set past the deadline", time.Minute, func(f *Fake) { f.Set(t0.Add(2 * time.Minute)) }, true},
		{"set before the deadline", time.Minute, func(f *Fake) { f.Set(t0.Add(time.Second)) }, false},
		{"zero fires at once", 0, func(*Fake) {}, true},
		{"negative fires at once", -time.Second, func(*Fake) {}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake(t0)
			tm := f.NewTimer(tt.after)
			tt.move(f)
			at, ok := fired(tm)
			if ok != tt.want {
				t.Fatalf("fired = %v, want %v", ok, tt.want)
			}
			if ok && !at.Equal(f.Now()) {
				t.Fatalf("fired with %v, want the clock's time %v", at, f.Now())
			}
			if _, again := fired(tm); again {
				t.Fatal("timer fired twice")
			}
		})
	}
}

func TestFakeStopResetAndTimers(t *testing.T) {
	f := NewFake(t0)
	a, b := f.NewTimer(time.Minute), f.NewTimer(time.Hour)
	if n := f.Timers(); n != 2 {
		t.Fatalf("Timers() = %d, want 2", n)
	}
	if !a.Stop() {
		t.Fatal("Stop of an armed timer returned false")
	}
	if a.Stop() {
		t.Fatal("second Stop returned true")
	}
	f.Add(time.Minute)
	if _, ok := fired(a); ok {
		t.Fatal("stopped timer fired")
	}
	if b.Reset(time.Second) != true {
		t.Fatal("Reset of an armed timer returned false")
	}
	f.Add(time.Second)
	if _, ok := fired(b); !ok {
		t.Fatal("reset timer did not fire at its new deadline")
	}
	if n := f.Timers(); n != 0 {
		t.Fatalf("Timers() = %d after all fired or stopped, want 0", n)
	}
	if a.Reset(time.Minute) {
		t.Fatal("Reset of a stopped timer returned true")
	}
	f.Add(-time.Hour)
	if got := f.Now(); !got.Equal(t0.Add(time.Minute + time.Second - time.Hour)) {
		t.Fatalf("Now() = %v after moving back", got)
	}
}

func TestRealTimerFires(t *testing.T) {
	var c Clock = Real{}
	before := time.Now()
	if now := c.Now(); now.Before(before) {
		t.Fatalf("Real.Now() %v before time.Now() %v", now, before)
	}
	tm := c.NewTimer(time.Millisecond)
	select {
	case <-tm.C():
	case <-time.After(10 * time.Second):
		t.Fatal("real timer did not fire")
	}
	if tm.Reset(time.Hour) {
		t.Fatal("Reset of a fired timer returned true")
	}
	if !tm.Stop() {
		t.Fatal("Stop of an armed real timer returned false")
	}
}
