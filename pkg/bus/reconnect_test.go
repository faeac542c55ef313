package bus

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
)

// Reconnect waits follow bus.Reconnect: doubling from First to Max, each jittered
// into [wait/4, wait], so that clients that lost the bus together come back
// spread; and a client waits longer for a connect than the server waits for the
// auth callout.
func TestReconnectDelaySpreadsAndDoubles(t *testing.T) {
	for attempt, want := range map[int]time.Duration{1: 250 * time.Millisecond, 2: 500 * time.Millisecond, 3: time.Second, 5: 4 * time.Second, 50: 4 * time.Second} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := reconnectDelay(attempt)
			if d < want/4 || d > want {
				t.Fatalf("attempt %d waited %s, want within [%s, %s]", attempt, d, want/4, want)
			}
			seen[d] = true
		}
		if len(seen) < 50 {
			t.Fatalf("attempt %d: only %d distinct waits in 200: not spread", attempt, len(seen))
		}
	}
	if ConnectTimeout <= policy.AuthTimeout {
		t.Fatalf("clients give up after %s, before the server's auth timeout of %s", ConnectTimeout, policy.AuthTimeout)
	}
}

// While the process says its need is urgent, no reconnect wait passes
// UrgentReconnect.Max (a second), where the same attempts otherwise wait up to 4 s;
// the schedule is back to Reconnect's once it is not urgent.
func TestUrgentReconnectWaitsAtMostASecond(t *testing.T) {
	t.Cleanup(func() { SetUrgent(false) })
	longest := func() time.Duration {
		var m time.Duration
		for attempt := 1; attempt <= 20; attempt++ {
			for range 50 {
				m = max(m, reconnectDelay(attempt))
			}
		}
		return m
	}
	if m := longest(); m <= UrgentReconnect.Max { // the control: the usual schedule is longer
		t.Fatalf("not urgent, the longest wait was %s: no longer than the urgent bound %s", m, UrgentReconnect.Max)
	}
	SetUrgent(true)
	if m := longest(); m > UrgentReconnect.Max {
		t.Fatalf("urgent, a wait of %s, over %s", m, UrgentReconnect.Max)
	}
	SetUrgent(false)
	if m := longest(); m <= UrgentReconnect.Max {
		t.Fatalf("no longer urgent, still at most %s", m)
	}
}
