package issuer

import (
	"sync"
	"time"
)

// ReissueWindow is the window -max-early-certs-per-minute counts certificates in.
const ReissueWindow = time.Minute

// earlyFraction: a certificate issued to a holder whose previous one (from this
// replica) is younger than this fraction of its life is early. Renewals come at half
// the life (the rotator's SECRET_GRACE_PERIOD_RATIO), so however short the lifetime,
// a pod that renews on schedule is never early; a pod that refuses what it gets
// asks again at once, every time.
const earlyFraction = 4 // a quarter

// reissues counts, per holder (a pod, or a SPIFFE ID without one), the early
// certificates of the last ReissueWindow, so that a pod that keeps asking because it
// refuses what it gets (its ROOTCA does not accept the chain, say) is told so
// instead of being issued a certificate nobody uses on every retry. A forced renewal,
// a root rotation or a restart is one early certificate now and then. Per replica:
// a fleet of N signers issues at most N times the limit.
type reissues struct {
	limit int // early certificates per holder and window; 0: no limit

	mu   sync.Mutex
	seen map[string][]issue // in the window, oldest first, and the last one before it
	// sweepAbove is the number of holders above which the next certificate first
	// forgets every holder with nothing recent; sweeps counts those sweeps.
	sweepAbove, sweeps int
}

// minSweep is the fewest holders kept before the first sweep.
const minSweep = 4096

type issue struct {
	at    time.Time
	life  time.Duration
	early bool
}

// allow reports whether holder may be issued another certificate at now and, when
// not, how many early ones it was issued in the window and when the next is allowed.
func (r *reissues) allow(holder string, now time.Time) (ok bool, n int, next time.Time) {
	if r.limit <= 0 || holder == "" {
		return true, 0, time.Time{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var early []time.Time
	for _, is := range r.recent(holder, now) {
		if is.early && is.at.After(now.Add(-ReissueWindow)) {
			early = append(early, is.at)
		}
	}
	if len(early) < r.limit {
		return true, len(early), time.Time{}
	}
	return false, len(early), early[len(early)-r.limit].Add(ReissueWindow)
}

// issued records a certificate of lifetime life issued to holder at now.
func (r *reissues) issued(holder string, now time.Time, life time.Duration) {
	if r.limit <= 0 || holder == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string][]issue{}
	}
	if len(r.seen) > max(minSweep, r.sweepAbove) {
		// Forget holders with nothing recent, then wait until the map has doubled
		// again: a sweep costs every holder, so sweeping on every certificate once
		// there were 4,096 made a storm of N pods cost N² (10,000 pods with hour-long
		// certificates, all still recent: 42% of the signer's CPU).
		for h := range r.seen {
			r.recent(h, now)
		}
		r.sweepAbove, r.sweeps = 2*len(r.seen), r.sweeps+1
	}
	prev := r.recent(holder, now)
	is := issue{at: now, life: life}
	if n := len(prev); n > 0 && now.Sub(prev[n-1].at) < prev[n-1].life/earlyFraction {
		is.early = true
	}
	r.seen[holder] = append(prev, is)
}

// recent is holder's issues in the window before now, and the last one before the
// window while its life has not passed (an early certificate is told by it); r.mu
// is held.
func (r *reissues) recent(holder string, now time.Time) []issue {
	ts := r.seen[holder]
	i := 0
	for i+1 < len(ts) && !ts[i+1].at.After(now.Add(-ReissueWindow)) {
		i++
	}
	ts = ts[i:]
	if len(ts) == 1 && !ts[0].at.After(now.Add(-ReissueWindow)) && !now.Before(ts[0].at.Add(ts[0].life)) {
		ts = nil
	}
	if len(ts) == 0 {
		delete(r.seen, holder)
		return nil
	}
	r.seen[holder] = ts
	return ts
}
