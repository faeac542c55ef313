package identity

// How the CA flow retries: the wait between signing attempts and what each
// attempt leaves on record.

import (
	"context"
	"crypto"
	"errors"
	"time"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/sds-edge/internal/caclient"
)

// issue gets a new certificate, retrying until it succeeds or ctx ends. Only Run
// calls it: one CSR is in flight at a time. The wait between attempts (retryWait)
// grows from RetryMin to RetryMax but never past a quarter of the time the current
// certificate has left, and RetryNow ends it early.
func (m *Manager) issue(ctx context.Context, reason string) error {
	select { // a wake-up from before this renewal is not news
	case <-m.retryNow:
	default:
	}
	bo := backoff.Policy{First: m.cfg.RetryMin, Max: m.cfg.RetryMax}.Start()
	var key crypto.Signer // the renewal's, made by its first attempt that can
	var csrPEM []byte
	timedOut := 0 // attempts in a row that the signer did not answer in time
	for attempt := 0; ; attempt++ {
		var commit func()
		var err error
		if key == nil {
			key, csrPEM, err = m.newKey()
		}
		if err == nil {
			commit, err = m.issueOnce(ctx, key, csrPEM, attemptTimeout(m.cfg.RequestTimeout, timedOut))
		}
		if errors.Is(err, context.DeadlineExceeded) {
			timedOut++
		} else {
			timedOut = 0
		}
		m.record(err)
		m.obs.CSR(err, attempt > 0)
		if err == nil {
			commit()
			m.log.Info("certificate issued", "reason", reason, "serial", m.Serial(), "attempt", attempt+1)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := m.retryWait(bo.Current(), err)
		// Probes a second apart would fill the log: the first few failures and
		// then every tenth at WARN, the rest at DEBUG.
		logf := m.log.Debug
		if attempt < 3 || (attempt+1)%10 == 0 {
			logf = m.log.Warn
		}
		logf("signing failed, will retry", "reason", reason, "attempt", attempt+1, "retry_in", d, "error", err)
		if !m.wait(ctx, d) {
			return ctx.Err()
		}
		bo.Next()
		if m.woken {
			bo.Reset() // a new chance: start over
		}
	}
}

// attemptTimeout is the wait for an answer after timedOut attempts in a row went
// unanswered: RequestTimeout, doubling with each (at most maxAttemptTimeout). A
// signer that takes longer than a pod's timeout to answer — a storm's queue on a
// loaded bus — had each pod ask again and again, every repeat crossing the bus and
// the signer once more, each answer arriving after its asker had stopped waiting:
// the repeats were the overload. The same CSR asked again is answered with the
// certificate recorded for it, so waiting longer loses nothing; a frozen replica
// is still left after half of the first attempt (caclient).
func attemptTimeout(base time.Duration, timedOut int) time.Duration {
	return min(base<<min(timedOut, 6), max(base, maxAttemptTimeout))
}

// maxAttemptTimeout caps attemptTimeout.
const maxAttemptTimeout = time.Minute

// Retry-wait bounds besides RetryMin and RetryMax.
const (
	// probeWait is the longest wait after an attempt that nobody answered (no
	// signer on the bus, the CA refusing connections) or that timed out (a frozen
	// replica held it; the signers drop such a request unsigned): such an attempt
	// costs the CA nothing, and the next one may reach another replica.
	probeWait = time.Second
	// capFloor is the shortest cap that time-to-expiry puts on a wait: a quarter
	// of the time left, but not less (a certificate about to expire, or expired).
	capFloor = time.Second
)

// retryWait is the wait before the next attempt: the scheduled one, shortened for an
// attempt nobody answered (probeWait) and to a quarter of the time left before the
// current certificate expires (capFloor at least), with half of it jittered. A busy
// signer's refusal names the pod's slot in its waiting room (retry-after): the pod
// comes back then, a little after rather than before (asking early is turned away
// again), whatever the schedule says, unless its certificate's time left is shorter.
func (m *Manager) retryWait(scheduled time.Duration, err error) time.Duration {
	if slot := events.RetryAfterOf(err); slot > 0 {
		d := slot + slotJitter.Apply(slot/10)
		if st := m.Status(); !st.NotAfter.IsZero() {
			d = min(d, max(st.NotAfter.Sub(m.clock.Now())/4, capFloor))
		}
		return d
	}
	ceil := scheduled
	if errors.Is(err, caclient.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded) {
		ceil = min(ceil, probeWait)
	}
	if st := m.Status(); !st.NotAfter.IsZero() {
		ceil = min(ceil, max(st.NotAfter.Sub(m.clock.Now())/4, capFloor))
	}
	return retryJitter.Apply(ceil)
}

// slotJitter spreads the pods given neighbouring slots over a tenth of their wait.
var slotJitter = backoff.Policy{Jitter: 1}

// retryJitter spreads pods that failed together (a signer outage) over half of
// each wait.
var retryJitter = backoff.Policy{Jitter: 0.5}

// wait waits d on the manager's clock, or less if RetryNow is called (setting
// m.woken), but at least RetryMin after the failed attempt. It returns false when
// ctx ends first.
func (m *Manager) wait(ctx context.Context, d time.Duration) bool {
	m.woken = false
	floorAt := m.clock.Now().Add(m.cfg.RetryMin)
	t := m.clock.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C():
			return true
		case why := <-m.retryNow:
			m.log.Info("retrying now", "why", why)
			m.woken = true
			// The rest of RetryMin, if any (none if the clock was set back).
			if rest := floorAt.Sub(m.clock.Now()); rest > 0 && rest <= m.cfg.RetryMin && rest < d {
				t.Reset(rest)
				continue
			}
			return true
		}
	}
}

// record keeps the outcome of one signing attempt for Status.
func (m *Manager) record(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		m.failures, m.lastErr = 0, nil
		return
	}
	m.failures++
	m.lastErr = err
}
