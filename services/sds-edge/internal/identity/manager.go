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
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/caclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// Config is what the manager needs to know about the pod.
type Config struct {
	Pod            events.PodRef
	SPIFFEID       string
	TrustDomain    string
	TokenFile      string
	TTL            time.Duration
	KeyAlg         pki.KeyAlg
	PKCS8          bool
	SafetyRatio    float64
	RetryMin       time.Duration
	RetryMax       time.Duration
	RequestTimeout time.Duration
	// Anchors are the roots trusted before any bundle (-trust-anchors-file): the
	// first bundle must be endorsed by one of them. None: trust on first use.
	Anchors []*x509.Certificate
	// Provisioned is the provisioned certificate (PROV_CERT) the manager proves
	// itself with (CertChain + Proof; a gRPC CA is shown it over mTLS instead) when
	// it has neither a token nor a still-valid certificate of its own; nil: none.
	Provisioned func() (*tls.Certificate, error)
	// TrustDomainAliases are trust domains accepted as this one (Istio's
	// TRUST_DOMAIN_ALIASES): ROOTCA_SPIFFE verifies their IDs against our roots.
	TrustDomainAliases []string
	// CertSigner is the named signer every request asks for (Istio's
	// ISTIO_META_CERT_SIGNER); empty: the CA's default.
	CertSigner string
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

	mu       sync.Mutex
	failures int   // signing attempts failed in a row
	lastErr  error // the last failure's error
	key      crypto.Signer
	keyPEM   []byte
	chain    []*x509.Certificate
	chainPEM []string
	trust    *trust
	foreign  *trustbundle.Foreign // followed trust domains' roots (federated.go)

	bootOnce sync.Once
	woken    bool // the last wait was ended by RetryNow (only Run's goroutine uses it)
}

// New returns a manager. It does nothing until Run.
func New(cfg Config, signer Signer, store *secrets.Store, obs Observer, clk clock.Clock, log hclog.Logger) *Manager {
	return &Manager{cfg: cfg, signer: signer, store: store, obs: obs, clock: clk, log: log,
		renew: make(chan events.RenewDue, 1), retryNow: make(chan string, 1), trust: &trust{ca: trustbundle.New(cfg.TrustDomain, cfg.Anchors, clk.Now)}}
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

// Run issues the first certificate (retrying until it succeeds), then renews on
// request or at the safety deadline, until ctx ends. It returns nil on cancellation.
func (m *Manager) Run(ctx context.Context) error {
	if err := m.issue(ctx, "start"); err != nil {
		return nil // only ctx ends issue's retries
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

// deadline is when the manager renews by itself: SafetyRatio into the lifetime.
func (m *Manager) deadline() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	leaf := m.chain[0]
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(time.Duration(float64(life) * m.cfg.SafetyRatio))
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

// issue gets a new certificate, retrying until it succeeds or ctx ends. Only Run
// calls it: one CSR is in flight at a time. The wait between attempts (retryWait)
// grows from RetryMin to RetryMax but never past a quarter of the time the current
// certificate has left, and RetryNow ends it early.
func (m *Manager) issue(ctx context.Context, reason string) error {
	select { // a wake-up from before this renewal is not news
	case <-m.retryNow:
	default:
	}
	backoff := m.cfg.RetryMin
	for attempt := 0; ; attempt++ {
		commit, err := m.issueOnce(ctx)
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
		d := m.retryWait(backoff, err)
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
		backoff = min(2*backoff, m.cfg.RetryMax)
		if m.woken {
			backoff = m.cfg.RetryMin // a new chance: start over
		}
	}
}

// Retry-wait bounds besides RetryMin and RetryMax.
const (
	// probeWait is the longest wait after an attempt that nobody answered (no
	// signer on the bus, the CA refusing connections): such an attempt costs the
	// CA nothing, and the next one is how the pod sees it back.
	probeWait = time.Second
	// capFloor is the shortest cap that time-to-expiry puts on a wait: a quarter
	// of the time left, but not less (a certificate about to expire, or expired).
	capFloor = time.Second
)

// retryWait is the wait before the next attempt: the backoff, shortened for an
// attempt nobody answered (probeWait) and to a quarter of the time left before the
// current certificate expires (capFloor at least), with half of it jittered.
func (m *Manager) retryWait(backoff time.Duration, err error) time.Duration {
	ceil := backoff
	if errors.Is(err, caclient.ErrUnreachable) {
		ceil = min(ceil, probeWait)
	}
	if st := m.Status(); !st.NotAfter.IsZero() {
		ceil = min(ceil, max(st.NotAfter.Sub(m.clock.Now())/4, capFloor))
	}
	return ceil/2 + rand.N(ceil/2+1)
}

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

// issueOnce makes one signing attempt; on success commit installs the result.
// The request it sends (events.SignRequest) is the one the signer's issuer reads.
func (m *Manager) issueOnce(ctx context.Context) (commit func(), err error) {
	key, err := pki.GenerateKey(m.cfg.KeyAlg)
	if err != nil {
		return nil, err
	}
	csrPEM, err := pki.NewCSR(key, m.cfg.SPIFFEID)
	if err != nil {
		return nil, err
	}
	req := events.SignRequest{CSR: string(csrPEM), TTL: m.cfg.TTL, Pod: m.cfg.Pod, Resource: secrets.Default, KeyAlgorithm: string(m.cfg.KeyAlg), CertSigner: m.cfg.CertSigner}
	if err := m.credential(&req, csrPEM); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	resp, err := m.signer.Sign(rctx, req)
	cancel()
	if err != nil {
		return nil, err
	}
	chain, u, err := m.checkReply(resp, key)
	if err != nil {
		return nil, err
	}
	keyPEM, err := pki.EncodeKeyPEM(key, m.cfg.PKCS8)
	if err != nil {
		return nil, err
	}
	return func() {
		m.mu.Lock()
		m.key, m.keyPEM, m.chain, m.chainPEM = key, keyPEM, chain, resp.ChainPEM
		m.mu.Unlock()
		// A new root in the reply is a trust change, like trust.changed.
		rootsChanged := m.apply(u)
		m.publish(true, rootsChanged || !m.has(secrets.RootCA))
	}, nil
}

// credential fills a fresh token from the token file; when it cannot be read, a
// still-valid certificate proves who we are instead (CertChain + Proof): our own,
// else the provisioned one.
func (m *Manager) credential(req *events.SignRequest, csrPEM []byte) error {
	tok, terr := os.ReadFile(m.cfg.TokenFile)
	if terr == nil && len(strings.TrimSpace(string(tok))) > 0 {
		req.Token = strings.TrimSpace(string(tok))
		return nil
	}
	if terr == nil {
		terr = errors.New("token file is empty")
	}
	m.mu.Lock()
	key, chain, chainPEM := m.key, m.chain, m.chainPEM
	m.mu.Unlock()
	if key == nil || m.clock.Now().After(chain[0].NotAfter) {
		if m.cfg.Provisioned == nil {
			return fmt.Errorf("read token %s: %w", m.cfg.TokenFile, terr)
		}
		prov, err := m.cfg.Provisioned()
		if err != nil {
			return fmt.Errorf("read token %s: %w; and no valid certificate: %w", m.cfg.TokenFile, terr, err)
		}
		signer, ok := prov.PrivateKey.(crypto.Signer)
		if !ok {
			return fmt.Errorf("provisioned key is a %T, not a signing key", prov.PrivateKey)
		}
		key, chainPEM = signer, nil
		for _, der := range prov.Certificate {
			chainPEM = append(chainPEM, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
		}
		m.log.Warn("token unreadable and no valid certificate, renewing with the provisioned certificate", "error", terr)
	} else {
		m.log.Warn("token unreadable, renewing with the current certificate", "error", terr)
	}
	b, _ := pem.Decode(csrPEM)
	proof, err := pki.SignProof(key, b.Bytes)
	if err != nil {
		return err
	}
	req.CertChain, req.Proof = chainPEM, base64.StdEncoding.EncodeToString(proof)
	return nil
}

// ClientCertificate is the current certificate with its key, for renewal by
// certificate over mTLS (the key stays in this process); an error when there is none
// or it has expired.
func (m *Manager) ClientCertificate() (*tls.Certificate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.key == nil {
		return nil, errors.New("no certificate yet")
	}
	if now := m.clock.Now(); now.After(m.chain[0].NotAfter) {
		return nil, fmt.Errorf("the current certificate expired at %s", m.chain[0].NotAfter.Format(time.RFC3339))
	}
	c := &tls.Certificate{PrivateKey: m.key, Leaf: m.chain[0]}
	for _, x := range m.chain {
		if x.IsCA && x.CheckSignatureFrom(x) == nil {
			continue // the root: the CA has it
		}
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c, nil
}

func (m *Manager) has(name string) bool { _, ok := m.store.Get(name); return ok }

// publish stores `default` and/or `ROOTCA` and writes the files.
func (m *Manager) publish(cert, roots bool) {
	now := m.clock.Now()
	m.mu.Lock()
	rootsPEM := m.trust.pem(now)
	keyPEM := m.keyPEM
	chainPEM := []byte(strings.Join(trimAll(m.chainPEM), "\n") + "\n")
	haveCert := m.key != nil
	m.mu.Unlock()
	if roots && len(rootsPEM) > 0 {
		m.set(sdsclient.Secret{Name: secrets.RootCA, TrustedCA: rootsPEM})
		m.publishSPIFFE(rootsPEM)
	}
	if cert && haveCert {
		m.set(sdsclient.Secret{Name: secrets.Default, CertChain: chainPEM, PrivateKey: keyPEM})
	}
	if haveCert {
		m.obs.Files(keyPEM, chainPEM, rootsPEM)
	}
}

func (m *Manager) set(s sdsclient.Secret) {
	m.obs.Changed(m.store.Set(s))
}

func trimAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

// checkReply decides whether a signing reply may be installed for key and returns
// the parsed chain and the bundle update to apply with it. The chain must be leaf
// first, each certificate signed by the next, and the leaf must carry key and
// exactly the pod's SPIFFE ID (so that no responder can hand the pod another
// identity). An endorsed bundle in the reply (or, before any, the first one, see
// trustbundle.Set.Check) may add roots; then the leaf must verify to a root trusted
// now or just endorsed. An unendorsed reply (Istio's) adds nothing after the
// first: its leaf must verify to the roots trusted already.
func (m *Manager) checkReply(resp caclient.Response, key crypto.Signer) ([]*x509.Certificate, trustbundle.Update, error) {
	u := trustbundle.Update{Stale: true}
	chain, err := checkChain(resp.ChainPEM, m.cfg.SPIFFEID)
	if err != nil {
		return nil, u, err
	}
	if !publicKeysEqual(chain[0].PublicKey, key.Public()) {
		return nil, u, errors.New("signed certificate is not for our key")
	}
	b := resp.Bundle
	if b.TrustDomain == "" {
		b.TrustDomain = m.cfg.TrustDomain
	}
	if resp.Endorsed || !m.trust.ca.Bootstrapped() {
		if u, err = m.trust.ca.Check(b); err != nil {
			m.obs.TrustRejected(SourceSignReply)
			return nil, u, fmt.Errorf("sign reply: %w", err)
		}
	}
	var extra []*x509.Certificate
	if !u.Stale {
		extra = u.Roots
	}
	// A CA clock a little ahead of ours must not fail a fresh leaf.
	at := m.clock.Now()
	if nb := chain[0].NotBefore; at.Before(nb) {
		at = nb
	}
	if err := m.trust.ca.VerifyChain(chain, extra, at); err != nil {
		m.obs.TrustRejected(SourceSignReply)
		return nil, u, fmt.Errorf("signed certificate: %w", err)
	}
	return chain, u, nil
}

// checkChain parses and checks a reply chain: at least leaf and root, each signed by
// the next, and a leaf for exactly id. Whether the root is one the pod trusts is
// checkReply's next step.
func checkChain(pems []string, id string) ([]*x509.Certificate, error) {
	if len(pems) < 2 {
		return nil, fmt.Errorf("chain has %d certificate(s): want leaf and root at least", len(pems))
	}
	chain, err := pki.ParseCertPEMs(pems)
	if err != nil {
		return nil, fmt.Errorf("parse chain: %w", err)
	}
	for i := 0; i+1 < len(chain); i++ {
		if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
			return nil, fmt.Errorf("chain[%d] not signed by chain[%d]: %w", i, i+1, err)
		}
	}
	if err := checkLeafID(chain[0], id); err != nil {
		return nil, err
	}
	return chain, nil
}

// checkLeafID checks that leaf's one URI SAN is exactly id.
func checkLeafID(leaf *x509.Certificate, id string) error {
	if id == "" {
		return errors.New("no spiffe id to check the signed certificate against")
	}
	uris := make([]string, len(leaf.URIs))
	for i, u := range leaf.URIs {
		uris[i] = u.String()
	}
	if len(uris) != 1 || uris[0] != id {
		return fmt.Errorf("signed certificate is for %v, not %s", uris, id)
	}
	return nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}
