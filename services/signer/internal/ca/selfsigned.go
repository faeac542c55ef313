package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go/jetstream"
)

// RootKey is the KV key that holds the self-signed root (see stored).
const RootKey = "root"

// Notifier publishes a change of the trust bundle (one attempt; the caller retries).
type Notifier func(ctx context.Context, tc events.TrustChanged) error

// SelfSignedConfig configures the self-signed mode.
type SelfSignedConfig struct {
	TrustDomain    string
	KeyAlg         pki.KeyAlg
	Bucket         string
	Replicas       int
	RootTTL        time.Duration
	CheckInterval  time.Duration
	GracePercent   int
	NewKeyOnRotate bool
	// KEK seals the root keys in KV; required.
	KEK *KEK
	// MaxLeafTTL is the longest leaf lifetime (-max-ttl): a retired root leaves the
	// bundle MaxLeafTTL + RetireSlack after it was retired, or when it expires.
	MaxLeafTTL time.Duration
	// RotateMinInterval is the shortest time between a rotation and a forced one; 0: no limit.
	RotateMinInterval time.Duration
	// ExtraRoots join the trust bundle after the root's own (Material.AddRoots):
	// an external signer's, when the signer is a registration authority.
	ExtraRoots []*x509.Certificate
}

// SelfSigned keeps a self-signed root in JetStream KV. Replicas starting together
// converge on one root (create-only), rotate it with compare-and-set, and follow each
// other's changes through a KV watch.
type SelfSigned struct {
	cfg  SelfSignedConfig
	js   jetstream.JetStream
	auth *Authority
	log  hclog.Logger
	clk  clock.Clock
	kv   jetstream.KeyValue
	rec  atomic.Pointer[record] // the record the current material was built from
	ann  *announcer

	livesMu sync.Mutex
	lives   map[string]Lives // by key id: the longest leaves each key signed (see Lives)
	// lastKeyID is the key id last computed (keyID).
	lastKeyID atomic.Pointer[certKeyID]
}

// NewSelfSigned returns the self-signed source; Start loads or creates the root.
func NewSelfSigned(cfg SelfSignedConfig, js jetstream.JetStream, auth *Authority, notify Notifier, log hclog.Logger, clk clock.Clock) *SelfSigned {
	return &SelfSigned{cfg: cfg, js: js, auth: auth, log: log, clk: clk, ann: newAnnouncer(notify, log, clk)}
}

func (s *SelfSigned) now() time.Time { return s.clk.Now() }

// Start opens the bucket and loads the root, creating it when there is none yet.
func (s *SelfSigned) Start(ctx context.Context) error {
	if s.cfg.KEK == nil {
		return errors.New("-ca-kek-file: required in self-signed mode")
	}
	if err := s.openBucket(ctx); err != nil {
		return err
	}
	for attempt := 0; attempt < 5; attempt++ {
		var e jetstream.KeyValueEntry
		err := bus.Retry(ctx, s.clk, s.log, s.rootWhat(), func(ctx context.Context) error {
			var err error
			e, err = s.kv.Get(ctx, RootKey)
			return err
		})
		switch {
		case err == nil:
			return s.loadRoot(ctx, e)
		case errors.Is(err, jetstream.ErrKeyNotFound):
			created, err := s.createRoot(ctx)
			if err != nil || created {
				return err
			}
			// Another replica won (or an attempt that timed out did store ours): load it.
		default:
			return fmt.Errorf("read root from kv: %w", err)
		}
	}
	return errors.New("root: could not create or load it")
}

func (s *SelfSigned) rootWhat() string { return "ca root " + s.cfg.Bucket + "/" + RootKey }

// openBucket opens (or creates) the CA's bucket. Each JetStream call is retried in
// short attempts (bus.Retry): on a cluster still electing its leader one long
// request would time out and stop the signer.
func (s *SelfSigned) openBucket(ctx context.Context) error {
	err := bus.Retry(ctx, s.clk, s.log, "ca bucket "+s.cfg.Bucket, func(ctx context.Context) error {
		var err error
		s.kv, err = s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: s.cfg.Bucket, Description: "meshagent self-signed CA (root keys sealed under the signers' KEK)",
			// History 1: a replaced value (a retired key) does not linger in the bucket's history.
			History: 1, Replicas: max(1, s.cfg.Replicas), Storage: jetstream.FileStorage,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("open kv bucket: %w", err)
	}
	return nil
}

// loadRoot installs the stored root e, with its leaves' lifetimes, and checks it.
func (s *SelfSigned) loadRoot(ctx context.Context, e jetstream.KeyValueEntry) error {
	rec, err := s.open(e.Value())
	if err != nil {
		return fmt.Errorf("load root from kv %s/%s: %w", s.cfg.Bucket, RootKey, err)
	}
	m, err := s.materialOf(rec)
	if err != nil {
		return fmt.Errorf("load root from kv %s/%s: %w", s.cfg.Bucket, RootKey, err)
	}
	if err := bus.Retry(ctx, s.clk, s.log, "leaf lifetimes", func(ctx context.Context) error { return s.loadLives(ctx, rec) }); err != nil {
		return fmt.Errorf("load leaf lifetimes: %w", err)
	}
	s.installRec(rec, m)
	s.ann.settle(m.Generation)
	s.log.Info("root loaded", "fingerprint", m.RootFingerprint(), "generation", m.Generation, "not_after", m.RootNotAfter(), "roots", len(m.Roots))
	return s.Check(ctx)
}

// createRoot makes the first root and stores it unless another replica stored
// one first (created false: load that one).
func (s *SelfSigned) createRoot(ctx context.Context) (created bool, err error) {
	key, err := pki.GenerateKey(s.cfg.KeyAlg)
	if err != nil {
		return false, fmt.Errorf("root key: %w", err)
	}
	root, err := s.newRoot(key)
	if err != nil {
		return false, err
	}
	rec := record{gen: 1, roots: []*x509.Certificate{root}, keys: []crypto.Signer{key}, keyTracked: true}
	data, err := s.seal(rec)
	if err != nil {
		return false, err
	}
	m, err := s.materialOf(rec)
	if err != nil {
		return false, err
	}
	err = bus.Retry(ctx, s.clk, s.log, s.rootWhat(), func(ctx context.Context) error {
		_, err := s.kv.Create(ctx, RootKey, data)
		return err
	})
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store root: %w", err)
	}
	s.installRec(rec, m)
	s.ann.settle(m.Generation)
	s.log.Info("root created", "fingerprint", m.RootFingerprint(), "not_after", m.RootNotAfter())
	return true, nil
}

// Announced is the highest bundle generation this replica knows to be announced
// with trust.changed (or to need no announcement: the one it started on).
func (s *SelfSigned) Announced() uint64 { return s.ann.announced() }

// AnnounceFailures counts failed attempts to publish trust.changed (each is retried).
func (s *SelfSigned) AnnounceFailures() uint64 { return s.ann.failures.Load() }

// Run follows root changes made by any replica, announces each new generation, and
// checks the root every CheckInterval — and at each boundary of a rotation's phases
// (nextCheck), since the check is what installs a phase — until ctx is done.
func (s *SelfSigned) Run(ctx context.Context) error {
	actx, stopAnnounce := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() { defer close(announced); s.ann.run(actx) }()
	defer func() { stopAnnounce(); <-announced }()
	w, err := s.watch(ctx, RootKey)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch root: %w", err)
	}
	defer func() { _ = w.Stop() }()
	lw, err := s.watch(ctx, LivesKeyPrefix+"*")
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch leaf lifetimes: %w", err)
	}
	defer func() { _ = lw.Stop() }()
	t := s.clk.NewTimer(s.nextCheck())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("root watch closed")
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			s.follow(ctx, e)
			t.Reset(s.nextCheck()) // a new root brings new boundaries
		case e, ok := <-lw.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("leaf lifetimes watch closed")
			}
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				s.followLives(e.Key(), e.Value())
				t.Reset(s.nextCheck()) // the leaves issued move the boundaries
			}
		case <-t.C():
			if err := s.Check(ctx); err != nil {
				s.log.Error("root check failed", "error", err)
			}
			t.Reset(s.nextCheck())
		}
	}
}

// watch opens a watch on key, retried while JetStream is away or slow (bus.OpenWatch).
func (s *SelfSigned) watch(ctx context.Context, key string) (jetstream.KeyWatcher, error) {
	return bus.OpenWatch(ctx, s.clk, s.log, "ca bucket watch "+key, func(ctx context.Context) (jetstream.KeyWatcher, error) {
		return s.kv.Watch(ctx, key)
	})
}

// boundarySlack is how long after a phase boundary its check runs, so that the
// check sees the boundary passed on every replica's clock reading.
const boundarySlack = 250 * time.Millisecond

// nextCheck is the wait before the next root check: CheckInterval, or less when a
// rotation's next boundary — phase 2, phase 3, the old root leaving — comes first.
// Without it a phase began only at the first interval after its time: with the
// default hour, phase-1 chains (ending at the old root) were handed out up to an
// hour into phase 2 while phase 3 did not move.
func (s *SelfSigned) nextCheck() time.Duration {
	d := s.cfg.CheckInterval
	now := s.now()
	p := s.Plan()
	for _, at := range []time.Time{p.NewLast, p.Settled, p.OldLeave} {
		if at.After(now) {
			d = min(d, at.Sub(now)+boundarySlack)
		}
	}
	return d
}

// follow installs a root written to KV (by any replica) and announces it.
func (s *SelfSigned) follow(ctx context.Context, e jetstream.KeyValueEntry) {
	rec, err := s.open(e.Value())
	if err != nil {
		s.log.Error("ignoring root in kv that this signer cannot load", "revision", e.Revision(), "error", err)
		return
	}
	m, err := s.materialOf(rec)
	if err != nil {
		s.log.Error("ignoring invalid root in kv", "revision", e.Revision(), "error", err)
		return
	}
	if s.installRec(rec, m) {
		s.log.Info("root changed by another replica", "fingerprint", m.RootFingerprint(), "generation", m.Generation)
	}
	// Whoever wrote it may have failed to announce it: announce it too, unless it
	// is in the stream by then (the notifier looks; the event id also makes
	// JetStream keep one). Waiting first lets the writer go first, so that pods,
	// which hear the subject itself, get the change once.
	if rec.reason != "" {
		tc := s.event(rec, m)
		go func() {
			if backoff.Wait(ctx, s.clk, foreignAnnounceDelay) {
				s.ann.observe(tc)
			}
		}()
	}
}

// foreignAnnounceDelay is how long a replica that sees another's root change
// waits before announcing it in the writer's stead.
var foreignAnnounceDelay = 2 * time.Second

// Check rotates the root when less than GracePercent of its life is left, and removes
// old roots from the bundle once no leaf they signed can still be valid.
func (s *SelfSigned) Check(ctx context.Context) error {
	m := s.auth.Current()
	if m == nil {
		return errors.New("no root loaded")
	}
	now := s.now()
	root := m.Roots[0]
	if s.due(root, now) {
		s.log.Info("root near expiry, rotating", "fingerprint", m.RootFingerprint(), "left", root.NotAfter.Sub(now).Round(time.Second), "not_after", root.NotAfter)
		_, err := s.update(ctx, func(rec record) (record, string, error) {
			if !s.due(rec.roots[0], s.now()) {
				return rec, "", nil // another replica rotated first
			}
			return s.rotated(rec, s.cfg.NewKeyOnRotate, false)
		})
		return err
	}
	if rec := s.rec.Load(); rec != nil && s.phaseAt(*rec, now) != m.Phase() {
		// A phase boundary passed: same bundle, another chain (nothing to announce).
		_, err := s.update(ctx, func(rec record) (record, string, error) { return rec, "", nil })
		return err
	}
	rec := s.rec.Load()
	for i := 1; rec != nil && i < len(rec.roots); i++ {
		if !s.leavesAt(*rec, i).After(now) {
			_, err := s.update(ctx, func(rec record) (record, string, error) {
				next, reason := s.pruned(rec, s.now())
				return next, reason, nil
			})
			return err
		}
	}
	return nil
}

// due reports whether less than GracePercent of root's life is left at now.
func (s *SelfSigned) due(root *x509.Certificate, now time.Time) bool {
	life := root.NotAfter.Sub(root.NotBefore)
	return root.NotAfter.Sub(now) < life/100*time.Duration(s.cfg.GracePercent) // /100 first: no overflow for long roots
}

// Rotate issues a new root now (meshctl rotate root), with a new key when asked. It
// is refused (ErrRotateTooSoon, ErrBundleFull) without any change.
func (s *SelfSigned) Rotate(ctx context.Context, newKey bool) (*Material, error) {
	return s.update(ctx, func(rec record) (record, string, error) {
		return s.rotated(rec, newKey || s.cfg.NewKeyOnRotate, true)
	})
}

// readRoot reads and opens the stored root, and returns its revision.
func (s *SelfSigned) readRoot(ctx context.Context) (record, uint64, error) {
	e, err := s.kv.Get(ctx, RootKey)
	if err != nil {
		return record{}, 0, fmt.Errorf("read root: %w", err)
	}
	rec, err := s.open(e.Value())
	if err != nil {
		return record{}, 0, err
	}
	return rec, e.Revision(), nil
}

// update applies change to the stored root with compare-and-set. change returns the
// reason of the change, or "" when there is nothing to do. When another replica
// changed the root first, change is re-evaluated on the newer value. The replica
// whose write wins queues trust.changed (Run publishes it, with retries).
func (s *SelfSigned) update(ctx context.Context, change func(record) (record, string, error)) (*Material, error) {
	for attempt := 0; attempt < 5; attempt++ {
		rec, rev, err := s.readRoot(ctx)
		if err != nil {
			return nil, err
		}
		next, reason, err := change(rec)
		if err != nil {
			return nil, err
		}
		if reason == "" {
			m, err := s.materialOf(rec)
			if err == nil {
				s.installRec(rec, m)
			}
			return m, err
		}
		next.gen, next.reason = rec.gen+1, reason
		next.added, next.remove = diffRoots(rec.roots, next.roots)
		m, err := s.materialOf(next)
		if err != nil {
			return nil, err
		}
		data, err := s.seal(next)
		if err != nil {
			return nil, err
		}
		if _, err := s.kv.Update(ctx, RootKey, data, rev); err != nil {
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue
			}
			return nil, fmt.Errorf("store root: %w", err)
		}
		s.installRec(next, m)
		s.log.Info("trust bundle changed", "reason", reason, "generation", m.Generation, "fingerprint", m.RootFingerprint(), "roots", len(m.Roots), "keys", len(next.keys))
		s.ann.observe(s.event(next, m))
		return m, nil
	}
	return nil, errors.New("root: too many concurrent changes")
}

// event is the trust.changed announcing rec (material m), endorsed.
func (s *SelfSigned) event(rec record, m *Material) events.TrustChanged {
	return events.TrustChanged{TrustDomain: s.cfg.TrustDomain, Roots: m.RootPEMs(), Added: rec.added, Removed: rec.remove,
		Reason: rec.reason, Generation: m.Generation, Endorsements: m.Endorsements()}
}

// newRoot makes a root certificate with key, valid from now (less Backdate) for RootTTL.
func (s *SelfSigned) newRoot(key crypto.Signer) (*x509.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := s.now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{s.cfg.TrustDomain}, CommonName: "meshagent root CA"},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(s.cfg.RootTTL),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create root: %w", err)
	}
	return x509.ParseCertificate(der)
}
