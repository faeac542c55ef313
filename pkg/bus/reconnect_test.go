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
