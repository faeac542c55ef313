package issuer

import (
	"sync"
	"time"
)

// ReissueWindow is the window -max-certs-per-pod-minute counts certificates in.
const ReissueWindow = time.Minute

// reissues counts the certificates issued to each holder (a pod, or a SPIFFE ID
// without one) in the last ReissueWindow, so that a pod that keeps asking because it
// refuses what it gets (its ROOTCA does not accept the chain, say) is told so
// instead of being issued a certificate nobody uses on every retry. Per replica: a
// fleet of N signers issues at most N times the limit.
type reissues struct {
	limit int // per holder and window; 0: none

	mu   sync.Mutex
	seen map[string][]time.Time // issue times in the window, oldest first
}

// allow reports whether holder may be issued another certificate at now and, when
// not, how many it was issued in the window and when the next is allowed.
func (r *reissues) allow(holder string, now time.Time) (ok bool, n int, next time.Time) {
	if r.limit <= 0 || holder == "" {
		return true, 0, time.Time{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.recent(holder, now)
	if len(ts) < r.limit {
		return true, len(ts), time.Time{}
	}
	return false, len(ts), ts[len(ts)-r.limit].Add(ReissueWindow)
}

// issued records a certificate issued to holder at now.
func (r *reissues) issued(holder string, now time.Time) {
	if r.limit <= 0 || holder == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string][]time.Time{}
	}
	if len(r.seen) > 4096 { // forget holders with nothing in the window
		for h := range r.seen {
			if len(r.recent(h, now)) == 0 {
				delete(r.seen, h)
			}
		}
	}
	r.seen[holder] = append(r.recent(holder, now), now)
}

// recent is holder's issue times within the window before now; r.mu is held.
func (r *reissues) recent(holder string, now time.Time) []time.Time {
	ts := r.seen[holder]
	i := 0
	for i < len(ts) && !ts[i].After(now.Add(-ReissueWindow)) {
		i++
	}
	ts = ts[i:]
	if len(ts) == 0 {
		delete(r.seen, holder)
		return nil
	}
	r.seen[holder] = ts
	return ts
}
