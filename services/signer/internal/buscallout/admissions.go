package buscallout

import (
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
)

// admissions counts the connections admitted per pod within a sliding window (the
// pods' user lifetime). Every user the callout mints expires within that window,
// so a pod admitted at most max times in it holds at most max connections at once
// (on this signer replica: each replica answering the callout counts its own).
// NATS has no per-user connection limit a callout user carries; this is the bound.
type admissions struct {
	mu    sync.Mutex
	pods  map[string][]time.Time // admission times, oldest first
	sweep time.Time              // next time every pod's stale times are dropped
}

// admissionKey is what admissions counts by: one pod instance — its namespace and
// name and, when the credential names it, its UID (a pod-bound token's
// kubernetes.io.pod.uid). A pod recreated under the same name is a new object
// with a new UID and starts afresh: admissions its predecessor spent (a storm
// whose clients gave up on connections the callout had already admitted) do not
// lock it out for the rest of the window.
func admissionKey(caller authn.Caller) string {
	if caller.PodUID == "" {
		return caller.Pod.String()
	}
	return caller.Pod.String() + "#" + caller.PodUID
}

func newAdmissions() *admissions { return &admissions{pods: map[string][]time.Time{}} }

// take records an admission of pod at now and reports true, or reports false
// (and records nothing) when pod had max admissions within window before now.
func (a *admissions) take(pod string, now time.Time, window time.Duration, max int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.After(a.sweep) {
		// Forget pods that are gone, so that the map holds live pods only.
		for p, ts := range a.pods {
			if len(live(ts, now, window)) == 0 {
				delete(a.pods, p)
			}
		}
		a.sweep = now.Add(window)
	}
	ts := live(a.pods[pod], now, window)
	if len(ts) >= max {
		a.pods[pod] = ts
		return false
	}
	a.pods[pod] = append(ts, now)
	return true
}

// live is ts without the times older than window before now.
func live(ts []time.Time, now time.Time, window time.Duration) []time.Time {
	i := 0
	for i < len(ts) && !ts[i].After(now.Add(-window)) {
		i++
	}
	return ts[i:]
}
