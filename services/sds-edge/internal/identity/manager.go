// Package identity is sds-edge's CA flow: it owns the pod's private key, gets it
// certified (one CSR in flight, retried with backoff and jitter on the injected
// clock, never later than a quarter of the time the served certificate has left,
// and at once when told a path to the CA may be open again), renews it on the
// rotator's word or at its own safety deadline, keeps `default` and `ROOTCA` in the
// secret store current, and reports how its signing goes (Status).
package identity

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/caclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// Config is what the manager needs to know about the pod.
type Config struct {
	Pod         events.PodRef
	SPIFFEID    string
	TrustDomain string
	TokenFile   string
	TTL         time.Duration
	KeyAlg      pki.KeyAlg
	PKCS8       bool
	SafetyRatio float64
	// GraceRatio is the fraction of a certificate's life left when the rotator
	// asks for its renewal (SECRET_GRACE_PERIOD_RATIO): past that point, a bus
	// outage may have swallowed the renew-due (Reconnected).
	GraceRatio     float64
	RetryMin       time.Duration
	RetryMax       time.Duration
	RequestTimeout time.Duration
	// Anchors are the roots trusted before any bundle (-trust-anchors-file): the
	// first bundle must be endorsed by one of them. None: trust on first use.
	Anchors []*x509.Certificate
	// Kept are the roots of TrustState read at start (Anchors holds them too):
	// the roots the pod checked and trusted last, which it serves as ROOTCA until
	// its first bundle, rather than every anchor (a -ca-root-cert mounted before a
	// rotation still names a root the CA has since retired). None: Anchors.
	Kept []*x509.Certificate
	// Provisioned is the provisioned certificate (PROV_CERT) the manager proves
	// itself with (CertChain + Proof; a gRPC CA is shown it over mTLS instead) when
	// it has neither a token nor a still-valid certificate of its own; nil: none.
	Provisioned func() (*tls.Certificate, error)
	// TrustDomainAliases are trust domains accepted as this one (Istio's
	// TRUST_DOMAIN_ALIASES): ROOTCA_SPIFFE verifies their IDs against our roots.
	TrustDomainAliases []string
	// TrustState is the file the CA roots the pod trusts are written to (0600) at
	// every change, to be read back as Anchors after a restart; "": none.
	TrustState string
	// CertSigner is the named signer every request asks for (Istio's
	// ISTIO_META_CERT_SIGNER); empty: the CA's default.
	CertSigner string
	// CertState is the file the current key and chain are written to (0600, in
	// the pod's directory) at every change, and served again from at a restart
	// while still valid (restore.go); "": none.
	CertState string
	// OutputDir is OUTPUT_CERTS: read at a restart when CertState holds nothing.
	OutputDir string
}

// Sources of trust bundles, as counted when one is rejected.
const (
	SourceTrustChanged = "trust.changed"
	SourceBundle       = "bundle"
	SourceSignReply    = "sign-reply"
)

// Signer sends one signing request to a CA and returns its reply, unchecked
// (caclient.NATS, caclient.Istio).
type Signer interface {
	Sign(ctx context.Context, req events.SignRequest) (caclient.Response, error)
}

var (
	_ Signer = (*caclient.NATS)(nil)
	_ Signer = (*caclient.Istio)(nil)
)

// Observer hears about every change the manager makes.
type Observer interface {
	// Changed: resource e now has a new value, woken streams watch it.
	Changed(e *secrets.Entry, streams int)
	// Files: the key, chain and roots to write out (OUTPUT_CERTS).
	Files(keyPEM, chainPEM, rootsPEM []byte)
	// CSR: one signing attempt; err nil on success, retry true for a retry.
	CSR(err error, retry bool)
	// TrustRejected: a trust bundle or a signed chain from source was refused.
	TrustRejected(source string)
	// TrustBootstrapped: the first bundle was accepted, in mode (trustbundle.Mode).
	TrustBootstrapped(mode string)
}

// Manager runs the CA flow.
type Manager struct {
	cfg    Config
	signer Signer
	store  *secrets.Store
	obs    Observer
	clock  clock.Clock
	log    hclog.Logger

	renew chan events.RenewDue
	// retryNow ends a retry wait early (RetryNow), with the reason.
	retryNow chan string

	mu sync.Mutex
	// publishing orders publish calls: the state each one takes and the files it
	// writes go out in the same order (OUTPUT_CERTS never goes back to an older set).
	publishing sync.Mutex
	failures   int   // signing attempts failed in a row
	lastErr    error // the last failure's error
	key        crypto.Signer
	keyPEM     []byte
	chain      []*x509.Certificate
	chainPEM   []string
	got        time.Time // when the current chain came in a sign reply (zero: restored)
	trust      *trust
	foreign    *trustbundle.Foreign // followed trust domains' roots (federated.go)

	bootOnce sync.Once
	woken    bool // the last wait was ended by RetryNow (only Run's goroutine uses it)
}

// New returns a manager. It does nothing until Run.
func New(cfg Config, signer Signer, store *secrets.Store, obs Observer, clk clock.Clock, log hclog.Logger) *Manager {
	return &Manager{cfg: cfg, signer: signer, store: store, obs: obs, clock: clk, log: log,
		renew: make(chan events.RenewDue, 1), retryNow: make(chan string, 1), trust: &trust{ca: trustbundle.New(cfg.TrustDomain, cfg.Anchors, clk)}}
}

// Renew asks for a renewal (a renew-due event). A request about an older
// certificate, already replaced, is dropped (see stale); requests coalesce: one
// waiting is enough.
func (m *Manager) Renew(r events.RenewDue) {
	if cur, ok := m.stale(r); ok {
		m.log.Debug("ignoring stale renew", "serial", r.Serial, "current", cur)
		return
	}
	select {
	case m.renew <- r:
	default:
	}
}

// RetryNow ends the wait before the next signing attempt, if one is waiting: a
// path to the CA may be open again (the bus reconnected, Envoy asked for `default`
// again). Calls coalesce, and attempts are still at least RetryMin apart.
func (m *Manager) RetryNow(why string) {
	select {
	case m.retryNow <- why:
	default:
	}
}

// Reconnected is told that the bus is back. It ends a retry wait (RetryNow), and
// since the rotator publishes a renew-due once, on core NATS, one sent while the
// pod was away is lost and the pod would renew only at its safety deadline: so
// when the current certificate is past the point the rotator asks for its
// renewal, it renews now, as the renew-due would have made it.
func (m *Manager) Reconnected() {
	m.RetryNow("bus reconnected")
	if due, ok := m.renewDue(); ok && !m.clock.Now().Before(due) {
		m.log.Info("renewing after reconnecting: the renew-due may have been sent while the bus was away", "renew_due", due)
		m.Renew(events.RenewDue{Reason: "bus-reconnected"})
	}
}

// renewDue is when the rotator asks for the current certificate's renewal at the
// earliest: GraceRatio of its life left (it counts from the issuance, a little
// after NotBefore; see life). ok is false before the first certificate or without a ratio.
func (m *Manager) renewDue() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.chain) == 0 || m.cfg.GraceRatio <= 0 || m.cfg.GraceRatio >= 1 {
		return time.Time{}, false
	}
	start, life := m.life()
	return start.Add(time.Duration(float64(life) * (1 - m.cfg.GraceRatio))), true
}

// life is the current leaf's lifetime as renewals count it: from its NotBefore,
// or from when the reply came if that is later, to its NotAfter. Istio's CA
// backdates NotBefore by two minutes (ClockSkewGracePeriod) and its agent counts
// from the time it got the certificate: counted from NotBefore, a certificate of a
// few minutes would be due for renewal the moment it arrives, and again after
// every renewal. Call with m.mu held.
func (m *Manager) life() (start time.Time, life time.Duration) {
	leaf := m.chain[0]
	start = leaf.NotBefore
	if m.got.After(start) && m.got.Before(leaf.NotAfter) {
		start = m.got
	}
	return start, leaf.NotAfter.Sub(start)
}

// Status is what the manager holds and how its last signing went.
type Status struct {
	Serial              string    // the current leaf's, "" before the first
	NotBefore, NotAfter time.Time // the current leaf's validity
	Failures            int       // signing attempts failed in a row (0: the last one worked)
	LastError           string    // the last failure's error
}

// Status returns the current leaf's validity and the signing record.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Status{Failures: m.failures}
	if m.lastErr != nil {
		st.LastError = m.lastErr.Error()
	}
	if len(m.chain) > 0 {
		leaf := m.chain[0]
		st.Serial, st.NotBefore, st.NotAfter = pki.SerialHex(leaf), leaf.NotBefore, leaf.NotAfter
	}
	return st
}

// Run serves the certificate kept from before a restart if it is still good, else
// issues the first one (retrying until it succeeds), then renews on
// request or at the safety deadline, until ctx ends. It returns nil on cancellation.
func (m *Manager) Run(ctx context.Context) error {
	// A still-valid certificate from before a restart is served at once; it is
	// renewed on the rotator's word or at its safety deadline, as any other.
	if !m.restore() {
		if err := m.issue(ctx, "start"); err != nil {
			return nil // only ctx ends issue's retries
		}
	}
	for {
		at := m.deadline()
		// A deadline already past (a short-lived or skewed certificate) must not
		// spin: renew at most once a second by ourselves.
		wait := max(at.Sub(m.clock.Now()), minSelfRenew)
		t := m.clock.NewTimer(wait)
		reason := "safety-deadline"
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case r := <-m.renew:
			t.Stop()
			if cur, ok := m.stale(r); ok {
				m.log.Debug("ignoring stale renew", "serial", r.Serial, "current", cur)
				continue
			}
			reason = r.Reason
		case <-t.C():
			m.log.Warn("renewing at safety deadline: no renew event came in time", "deadline", at)
		}
		if err := m.issue(ctx, reason); err != nil {
			return nil
		}
	}
}

// minSelfRenew is the shortest time between two renewals at the safety deadline.
const minSelfRenew = time.Second

// deadline is when the manager renews by itself: SafetyRatio into the lifetime
// (see life).
func (m *Manager) deadline() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	start, life := m.life()
	return start.Add(time.Duration(float64(life) * m.cfg.SafetyRatio))
}

// stale reports whether r is about an older certificate than the current leaf
// (and returns the current serial): it names another serial and its NotAfter is
// not after the current leaf's. A renew-due naming a newer certificate the pod
// never got (the signer recorded it, but its reply was lost) is not stale: the
// rotator tracks that one now, and every renewal it asks for must be obeyed.
// Repeats of one event are dropped by event id, in podfeed.
func (m *Manager) stale(r events.RenewDue) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.Serial == "" || len(m.chain) == 0 {
		return "", false
	}
	leaf := m.chain[0]
	cur := pki.SerialHex(leaf)
	return cur, r.Serial != cur && !r.NotAfter.After(leaf.NotAfter)
}

// Serial is the current leaf's serial (hex), or "".
func (m *Manager) Serial() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.chain) == 0 {
		return ""
	}
	return pki.SerialHex(m.chain[0])
}
