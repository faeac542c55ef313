package schedule

import (
	"slices"
	"time"
)

// ChangeTrust records that newest is now the newest root; bundle lists the other
// roots still trusted. Every entry under a root other than newest — one that was in
// the bundle before, or that any scheduled leaf chains to — is made due at once
// with reason root-rotation, unless a renew-due is already out for it. A stale
// generation (lower than one already seen) changes nothing. It returns how many
// entries it made due and whether the current root changed.
func (s *Schedule) ChangeTrust(newest string, bundle []string, generation uint64, now time.Time) (int, bool) {
	if generation != 0 && generation < s.trust.Generation {
		return 0, false
	}
	s.trust.Generation = max(s.trust.Generation, generation)
	if newest == s.trust.Current {
		return 0, false
	}
	old := slices.Clone(s.trust.Old)
	if s.trust.Current != "" {
		old = append(old, s.trust.Current)
	}
	old = append(old, bundle...)
	old = append(old, s.roots...)
	old = slices.DeleteFunc(old, func(r string) bool { return r == newest || r == "" })
	slices.Sort(old)
	old = slices.Compact(old)
	s.trust = Trust{Current: newest, Old: old, Generation: s.trust.Generation}
	return s.applyTrust(now.UnixNano()), true
}

// Trust returns the current view of the trust bundle, for persistence.
func (s *Schedule) Trust() Trust {
	t := s.trust
	t.Old = slices.Clone(t.Old)
	return t
}

// RestoreTrust sets the trust view loaded from durable state.
func (s *Schedule) RestoreTrust(t Trust, now time.Time) int {
	s.trust = Trust{Current: t.Current, Old: slices.Clone(t.Old), Generation: t.Generation}
	return s.applyTrust(now.UnixNano())
}

func (s *Schedule) applyTrust(now int64) int {
	for id, r := range s.roots {
		s.oldRoot[id] = slices.Contains(s.trust.Old, r)
	}
	marked := 0
	for i := range s.entries {
		e := &s.entries[i]
		if !s.oldRoot[e.root] || e.attempt > 0 || e.flags&fRootRotation != 0 {
			continue
		}
		e.flags |= fRootRotation
		marked++
		if e.which == inPending && e.due > now {
			e.due = now
			s.pending.fix(int32(i))
		}
	}
	return marked
}
