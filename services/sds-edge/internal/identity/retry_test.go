package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/sds-edge/internal/caclient"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestRetryWaitKnowsTheClock: the wait before the next attempt never exceeds a
// quarter of the time the certificate has left (a second at least), nor a second
// after an attempt nobody answered, and is otherwise the backoff, half jittered.
func TestRetryWaitKnowsTheClock(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	refused := errors.New("signer: unavailable")
	unreachable := fmt.Errorf("sign request: %w: no responders", caclient.ErrUnreachable)
	// A busy signer's refusal, as caclient wraps it: its slot is 20 s away.
	busy := fmt.Errorf("signer: %w", &events.ReplyError{Code: events.CodeUnavailable, Message: "signer busy", RetryAfterMillis: 20000})
	tests := []struct {
		name     string
		left     time.Duration // the leaf's NotAfter - now; 0: no leaf yet
		backoff  time.Duration
		err      error
		min, max time.Duration
	}{
		{"no certificate yet: the backoff", 0, 16 * time.Second, refused, 8 * time.Second, 16 * time.Second},
		{"plenty of time left: the backoff", time.Hour, 16 * time.Second, refused, 8 * time.Second, 16 * time.Second},
		{"7s left: at most 1.75s", 7 * time.Second, 16 * time.Second, refused, 875 * time.Millisecond, 1750 * time.Millisecond},
		{"2s left: the floor", 2 * time.Second, 16 * time.Second, refused, 500 * time.Millisecond, time.Second},
		{"expired: the floor", -time.Minute, 30 * time.Second, refused, 500 * time.Millisecond, time.Second},
		{"nobody answered: probe every second", time.Hour, 30 * time.Second, unreachable, 500 * time.Millisecond, time.Second},
		{"busy signer: its slot, however short the backoff", 0, 250 * time.Millisecond, busy, 20 * time.Second, 22 * time.Second},
		{"busy signer, plenty of time left: its slot", time.Hour, time.Minute, busy, 20 * time.Second, 22 * time.Second},
		{"busy signer, 8s left: a quarter of it", 8 * time.Second, 250 * time.Millisecond, busy, 2 * time.Second, 2 * time.Second},
		{"short backoff stays short", time.Hour, 100 * time.Millisecond, unreachable, 50 * time.Millisecond, 100 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{RetryMin: 100 * time.Millisecond, RetryMax: time.Minute}, nil, nil, nil, clock.NewFake(now), hclog.NewNullLogger())
			if tc.left != 0 {
				m.chain = []*x509.Certificate{{SerialNumber: big.NewInt(1), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(tc.left)}}
			}
			for range 50 {
				if d := m.retryWait(tc.backoff, tc.err); d < tc.min || d > tc.max {
					t.Fatalf("wait %s, want %s..%s", d, tc.min, tc.max)
				}
			}
		})
	}
}

// TestRetryNowEndsTheWait: RetryNow ends a long wait, but not before RetryMin
// has passed since the failed attempt; without it the wait runs its course.
func TestRetryNowEndsTheWait(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC))
	m := New(Config{RetryMin: 100 * time.Millisecond, RetryMax: time.Minute}, nil, nil, nil, clk, hclog.NewNullLogger())
	done := make(chan bool, 1)
	go func() { done <- m.wait(context.Background(), time.Minute) }()
	testkit.Eventually(t, "wait armed", func() bool { return clk.Timers() == 1 })
	m.RetryNow("test")
	clk.Add(50 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("RetryNow ended the wait before RetryMin")
	default:
	}
	clk.Add(50 * time.Millisecond) // RetryMin since the attempt
	testkit.Eventually(t, "wait ended by RetryNow", func() bool { return len(done) == 1 })
	if !<-done || !m.woken {
		t.Fatal("wait not ended as woken")
	}

	// RetryMin already past: RetryNow ends the wait at once.
	go func() { done <- m.wait(context.Background(), time.Minute) }()
	testkit.Eventually(t, "wait armed", func() bool { return clk.Timers() == 1 })
	clk.Add(time.Second)
	m.RetryNow("test")
	testkit.Eventually(t, "wait ended by RetryNow", func() bool { return len(done) == 1 })
	<-done

	// Not woken: the full wait.
	go func() { done <- m.wait(context.Background(), time.Minute) }()
	testkit.Eventually(t, "wait armed", func() bool { return clk.Timers() == 1 })
	clk.Add(time.Second)
	clk.Add(59 * time.Second)
	testkit.Eventually(t, "wait ended by its timer", func() bool { return len(done) == 1 })
	if <-done; m.woken {
		t.Fatal("woken without RetryNow")
	}
}

// TestAttemptTimeoutFollowsASlowSigner: each attempt in a row that went unanswered
// doubles the next one's wait, up to a minute (or CA_TIMEOUT if longer); an
// answered attempt starts over (issue resets the count).
func TestAttemptTimeoutFollowsASlowSigner(t *testing.T) {
	for _, tc := range []struct {
		base     time.Duration
		timedOut int
		want     time.Duration
	}{
		{4 * time.Second, 0, 4 * time.Second},
		{4 * time.Second, 1, 8 * time.Second},
		{4 * time.Second, 3, 32 * time.Second},
		{4 * time.Second, 4, time.Minute},
		{4 * time.Second, 1000, time.Minute},
		{90 * time.Second, 2, 90 * time.Second},
	} {
		if got := attemptTimeout(tc.base, tc.timedOut); got != tc.want {
			t.Errorf("attemptTimeout(%s, %d) = %s, want %s", tc.base, tc.timedOut, got, tc.want)
		}
	}
}
