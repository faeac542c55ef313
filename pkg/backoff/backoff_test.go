package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestScheduleDoublesToTheCapAndResets(t *testing.T) {
	b := Policy{First: 100 * time.Millisecond, Max: time.Second}.Start()
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Fatalf("after Reset: %v", d)
	}
}

func TestJitterStaysInItsBandAndSpreads(t *testing.T) {
	p := Policy{Jitter: 0.5}
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := p.Apply(time.Second)
		if d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("jitter 0.5 of 1s gave %v", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Fatalf("1000 jittered waits took only %d values: a crowd would retry together", len(seen))
	}
	if d := (Policy{Jitter: 7}).Apply(time.Second); d < 0 || d > time.Second {
		t.Fatalf("jitter above 1 is taken as 1: got %v", d)
	}
	if d := (Policy{}).Apply(-time.Second); d != 0 {
		t.Fatalf("a negative wait is none: got %v", d)
	}
}

func TestWaitFollowsTheInjectedClockAndContext(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	done := make(chan bool, 1)
	go func() { done <- Wait(context.Background(), clk, time.Minute) }()
	testkit.Eventually(t, "the timer armed", func() bool { return clk.Timers() == 1 })
	clk.Add(time.Minute)
	if !<-done {
		t.Fatal("Wait reported a cancelled context")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Wait(ctx, clk, time.Hour) {
		t.Fatal("Wait on a cancelled context reported a full wait")
	}
}
