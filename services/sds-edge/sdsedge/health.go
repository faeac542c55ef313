package sdsedge

import (
	"context"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/sds-edge/internal/identity"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// expiringShare is the share of its lifetime below which a certificate whose
// renewal keeps failing counts as expiring (not ready, cert.expiring published).
const expiringShare = 10

// certState says whether the certificate in st is fine (""), expiring with no
// renewal in sight (less than a tenth of its lifetime left and the last signing
// attempts failed), or expired, at now.
func certState(st identity.Status, now time.Time) string {
	switch {
	case st.NotAfter.IsZero():
		return ""
	case !now.Before(st.NotAfter):
		return events.CertStateExpired
	case st.Failures > 0 && st.NotAfter.Sub(now) < st.NotAfter.Sub(st.NotBefore)/expiringShare:
		return events.CertStateExpiring
	}
	return ""
}

// nextCertCheck is the next time certState can change by the clock alone: when
// less than a tenth of the lifetime is left, then NotAfter; zero once expired.
func nextCertCheck(st identity.Status, now time.Time) time.Time {
	if st.NotAfter.IsZero() {
		return time.Time{}
	}
	warn := st.NotAfter.Add(-st.NotAfter.Sub(st.NotBefore) / expiringShare)
	switch {
	case now.Before(warn):
		return warn
	case now.Before(st.NotAfter):
		return st.NotAfter
	}
	return time.Time{}
}

// certHealth is the readiness verdict on the certificate served as `default`: an
// error while it is expired (in any mode: files expire too), or, in the CA flow,
// while it is expiring with its renewal failing. It is computed at each /readyz
// from the clock, so it is exact to the moment of expiry.
func (e *Edge) certHealth() error {
	now := e.d.Clock.Now()
	if mgr := e.mgr.Load(); mgr != nil {
		st := mgr.Status()
		switch certState(st, now) {
		case events.CertStateExpired:
			return fmt.Errorf("serving an expired certificate: %s expired at %s (%d signing attempts failed since; last: %s)",
				st.Serial, st.NotAfter.UTC().Format(time.RFC3339), st.Failures, st.LastError)
		case events.CertStateExpiring:
			return fmt.Errorf("certificate %s expires at %s (%s left) and renewal is failing (%d attempts; last: %s)",
				st.Serial, st.NotAfter.UTC().Format(time.RFC3339), st.NotAfter.Sub(now).Round(time.Second), st.Failures, st.LastError)
		}
		return nil
	}
	if en, ok := e.store.Get(secrets.Default); ok && !en.NotAfter.IsZero() && !now.Before(en.NotAfter) {
		return fmt.Errorf("serving an expired certificate: %s expired at %s", en.Serial, en.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// wakeCertWatch tells watchExpiry that the manager's status changed (a signing
// attempt ended, a certificate was installed).
func (e *Edge) wakeCertWatch() {
	select {
	case e.certWake <- struct{}{}:
	default:
	}
}

// watchExpiry logs and publishes cert.expiring once per certificate and state, at
// the moment the state is reached: by a timer at the instant a tenth of the
// lifetime is left and at NotAfter, or when a signing attempt fails. It returns
// nil when ctx ends.
func (e *Edge) watchExpiry(ctx context.Context, mgr *identity.Manager) error {
	var said string // serial/state last announced
	for {
		st := mgr.Status()
		now := e.d.Clock.Now()
		if state := certState(st, now); state != "" && said != st.Serial+"/"+state {
			said = st.Serial + "/" + state
			e.log.Error("serving a certificate that is "+state+", still serving it until a renewal succeeds",
				"serial", st.Serial, "not_after", st.NotAfter, "failures", st.Failures, "last_error", st.LastError)
			e.publish(events.PodEventCertExpiring, events.CertExpiring{Pod: e.cfg.PodRef(), Resource: secrets.Default, Serial: st.Serial,
				NotAfter: st.NotAfter, State: state, Failures: st.Failures, LastError: truncate(st.LastError, 1024)})
		}
		var t clock.Timer
		var tc <-chan time.Time
		if next := nextCertCheck(st, now); !next.IsZero() {
			t = e.d.Clock.NewTimer(next.Sub(now))
			tc = t.C()
		}
		select {
		case <-ctx.Done():
		case <-tc:
		case <-e.certWake:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}
