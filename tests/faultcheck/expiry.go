package faultcheck

import (
	"os"
	"slices"
	"time"
)

// Window is a span of time [From, To).
type Window struct{ From, To time.Time }

// Has reports whether t falls in w.
func (w Window) Has(t time.Time) bool { return !t.Before(w.From) && t.Before(w.To) }

// Expiry is what a pod did about the expiry of what it served, over some samples.
type Expiry struct {
	// Served is how long a certificate past its expiry was served.
	Served time.Duration
	// Reachable is the part of Served outside the windows in which no signer was
	// reachable by any path: time a renewal could have prevented.
	Reachable time.Duration
	// ReadyLag is the worst time from an expiry to /readyz no longer saying 200;
	// 0 when nothing expired; Never when /readyz said 200 throughout an expiry.
	ReadyLag time.Duration
}

// Never is Expiry.ReadyLag when readiness never said so.
const Never time.Duration = -1

// MeasureExpiry draws the Expiry figures from samples (in time order), given the
// windows in which no signer was reachable. A sample without the SDS stream up
// (sds-edge not running: a restart that outlasted the certificate) serves
// nothing and has no readiness to judge; once sds-edge is back, its readiness
// lag counts from then, not from an expiry it was not running for.
func MeasureExpiry(samples []Sample, unreachable []Window) Expiry {
	var e Expiry
	var episode time.Time // NotAfter of the expired certificate being served
	var back time.Time    // when the SDS stream came back after being down
	said, wasDown := false, false
	closeEpisode := func() {
		if !episode.IsZero() && !said {
			e.ReadyLag = Never
		}
		episode, said = time.Time{}, false
	}
	for i, s := range samples {
		if !s.Up {
			wasDown = true
			continue
		}
		if wasDown {
			back, wasDown = s.At, false
		}
		if !s.Expired() {
			closeEpisode()
			continue
		}
		dt := time.Duration(0)
		if i+1 < len(samples) && samples[i+1].Up {
			dt = samples[i+1].At.Sub(s.At)
		}
		e.Served += dt
		if !slices.ContainsFunc(unreachable, func(w Window) bool { return w.Has(s.At) }) {
			e.Reachable += dt
		}
		if episode.IsZero() {
			episode = s.Cur.Leaf.NotAfter
		}
		if back.After(episode) {
			episode = back
		}
		if !said && s.Ready != 200 {
			said = true
			if lag := s.At.Sub(episode); e.ReadyLag != Never && lag > e.ReadyLag {
				e.ReadyLag = lag
			}
		}
	}
	closeEpisode()
	return e
}

// StrictEnv switches off (=0) the fault suites' assertions of what issue 10
// delivered (docs/reliability.md): no certificate served past expiry while a signer
// is reachable by some path, readiness saying so within a second when none is, no
// event dropped by its publisher. They are on by default; MESHAGENT_FAULTS_STRICT=0
// only measures and logs them, to see figures on a build that breaks them.
const StrictEnv = "MESHAGENT_FAULTS_STRICT"

// Strict reports whether the guarantees are asserted: unless StrictEnv is "0".
func Strict() bool { return os.Getenv(StrictEnv) != "0" }
