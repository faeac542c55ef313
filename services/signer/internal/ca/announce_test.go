package ca

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
)

// flaky is a Notifier that fails until opened, recording what it was asked to publish.
type flaky struct {
	mu     sync.Mutex
	open   bool
	tried  []uint64
	passed []uint64
}

func (f *flaky) notify(_ context.Context, tc events.TrustChanged) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tried = append(f.tried, tc.Generation)
	if !f.open {
		return errors.New("stream unavailable")
	}
	f.passed = append(f.passed, tc.Generation)
	return nil
}

func (f *flaky) state() (tried, passed []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint64(nil), f.tried...), append([]uint64(nil), f.passed...)
}

func TestAnnouncerRetriesUntilPublishedAndSkipsSuperseded(t *testing.T) {
	f := &flaky{}
	a := newAnnouncer(f.notify, hclog.NewNullLogger(), clock.Real{})
	a.min, a.max = time.Millisecond, 5*time.Millisecond
	a.settle(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.run(ctx) }()
	defer func() { cancel(); <-done }()

	a.observe(events.TrustChanged{Generation: 1}) // the generation started on: nothing to announce
	a.observe(events.TrustChanged{Generation: 2})
	testkit.EventuallyWithin(t, 30*time.Second, "gen 2 retried", func() bool { tried, _ := f.state(); return len(tried) >= 3 })
	a.observe(events.TrustChanged{Generation: 3}) // supersedes 2 before it got out
	a.observe(events.TrustChanged{Generation: 2}) // an older one seen late changes nothing
	testkit.EventuallyWithin(t, 30*time.Second, "gen 3 tried", func() bool { tried, _ := f.state(); return slices.Contains(tried, 3) })
	f.mu.Lock()
	f.open = true
	f.mu.Unlock()
	testkit.EventuallyWithin(t, 30*time.Second, "gen 3 announced", func() bool { return a.announced() == 3 })
	tried, passed := f.state()
	if len(passed) != 1 || passed[0] != 3 {
		t.Fatalf("published %v, want [3]", passed)
	}
	if slices.Contains(tried, 1) {
		t.Fatal("announced the generation it started on")
	}
	if i := slices.Index(tried, 3); slices.Contains(tried[i:], 2) {
		t.Fatalf("retried superseded gen 2 after gen 3: %v", tried)
	}
	if a.failures.Load() < 3 {
		t.Fatalf("%d failures counted", a.failures.Load())
	}
	// Seen again (e.g. from the KV watch): already published, not repeated.
	a.observe(events.TrustChanged{Generation: 3})
	a.mu.Lock()
	pending := a.pending
	a.mu.Unlock()
	if pending != nil {
		t.Fatalf("re-queued a published generation: %+v", pending)
	}
}
