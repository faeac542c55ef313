package schedule

import (
	"math"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

func (s *Schedule) refill(now int64) {
	if s.cfg.Rate <= 0 {
		return
	}
	if s.last != 0 && now > s.last {
		s.tokens = math.Min(float64(max(s.cfg.Burst, 1)), s.tokens+float64(now-s.last)/1e9*s.cfg.Rate)
	}
	if now > s.last {
		s.last = now
	}
}

// promote moves every pending entry whose time has come to the ready queue.
func (s *Schedule) promote(now int64) {
	for {
		i, ok := s.pending.top()
		if !ok || s.entries[i].due > now {
			return
		}
		s.pending.remove(i)
		e := &s.entries[i]
		if e.attempt > 0 && e.flags&fOverdue == 0 {
			e.flags |= fOverdue
			s.overdue++
		}
		e.readyEpoch = s.denials
		s.ready.push(i)
	}
}

// Take returns up to max renewals due at now, most urgent (earliest expiry) first,
// as far as the rate limit allows, and records them as sent: each comes back as a
// retry after the backoff unless a newer certificate replaces it first.
func (s *Schedule) Take(now time.Time, max int) []Renewal {
	n := now.UnixNano()
	s.promote(n)
	s.refill(n)
	var out []Renewal
	for len(out) < max {
		i, ok := s.ready.top()
		if !ok {
			break
		}
		if s.cfg.Rate > 0 {
			if s.tokens < 1 {
				s.denials++
				break
			}
			s.tokens--
		}
		s.ready.remove(i)
		e := &s.entries[i]
		e.attempt++
		e.sentAt = n
		pod, res := splitKey(e.key)
		r := Renewal{Pod: pod, Resource: res, Serial: e.serial, NotAfter: time.Unix(0, e.notAfter),
			Due: time.Unix(0, e.due), Reason: events.RenewScheduled, Attempt: int(e.attempt),
			RateLimited: e.readyEpoch != s.denials, Rev: e.rev}
		switch {
		case e.attempt > 1:
			r.Reason = events.RenewRetry
		case e.flags&fRootRotation != 0:
			r.Reason = events.RenewRootRotation
		}
		if n >= e.notAfter {
			r.Retired = true
			s.expired++
			s.removeAt(i)
		} else {
			e.due = n + s.retryWait(e.attempt)
			s.pending.push(i)
		}
		out = append(out, r)
	}
	return out
}

// NextWake is when Take next has something to return, if ever.
func (s *Schedule) NextWake(now time.Time) (time.Time, bool) {
	n := now.UnixNano()
	if len(s.ready.idx) > 0 {
		if s.cfg.Rate <= 0 {
			return now, true
		}
		s.refill(n)
		need := 1 - s.tokens
		if need <= 0 {
			return now, true
		}
		return now.Add(time.Duration(math.Ceil(need / s.cfg.Rate * 1e9))), true
	}
	if i, ok := s.pending.top(); ok {
		return time.Unix(0, s.entries[i].due), true
	}
	return time.Time{}, false
}

// Stats counts the schedule; MinNotAfter scans every entry.
func (s *Schedule) Stats() Stats {
	st := Stats{Scheduled: len(s.entries), Due: len(s.ready.idx), Overdue: s.overdue, Expired: s.expired}
	if len(s.entries) > 0 {
		m := s.entries[0].notAfter
		for i := range s.entries {
			m = min(m, s.entries[i].notAfter)
		}
		st.MinNotAfter = time.Unix(0, m)
	}
	return st
}
