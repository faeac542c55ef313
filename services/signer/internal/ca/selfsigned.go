package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go/jetstream"
)

// RootKey is the KV key that holds the self-signed root.
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
}

// stored is the KV value: Istio's istio-ca-secret equivalent. It holds the current
// root's private key, so the bucket must be readable by signers only.
type stored struct {
	Generation uint64   `json:"generation"`
	KeyPEM     string   `json:"key_pem"`
	Roots      []string `json:"roots"` // newest first; Roots[0] is the current root, made with KeyPEM
	// The change that made this generation, so that every replica announces it alike.
	Reason  string   `json:"reason,omitempty"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// SelfSigned keeps a self-signed root in JetStream KV. Replicas starting together
// converge on one root (create-only), rotate it with compare-and-set, and follow each
// other's changes through a KV watch.
type SelfSigned struct {
	cfg  SelfSignedConfig
	js   jetstream.JetStream
	auth *Authority
	log  hclog.Logger
	now  func() time.Time
	kv   jetstream.KeyValue
	ann  *announcer
}

// NewSelfSigned returns the self-signed source; Start loads or creates the root.
func NewSelfSigned(cfg SelfSignedConfig, js jetstream.JetStream, auth *Authority, notify Notifier, log hclog.Logger, now func() time.Time) *SelfSigned {
	if now == nil {
		now = time.Now
	}
	return &SelfSigned{cfg: cfg, js: js, auth: auth, log: log, now: now, ann: newAnnouncer(notify, log)}
}

// Start opens the bucket and loads the root, creating it when there is none yet.
func (s *SelfSigned) Start(ctx context.Context) error {
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: s.cfg.Bucket, Description: "meshagent self-signed CA (holds the root key)",
		// History 1: a replaced root key does not linger in the bucket's history.
		History: 1, Replicas: max(1, s.cfg.Replicas), Storage: jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("open kv bucket %s: %w", s.cfg.Bucket, err)
	}
	s.kv = kv
	for attempt := 0; attempt < 5; attempt++ {
		e, err := kv.Get(ctx, RootKey)
		switch {
		case err == nil:
			m, err := s.material(e.Value())
			if err != nil {
				return fmt.Errorf("load root from kv %s/%s: %w", s.cfg.Bucket, RootKey, err)
			}
			s.auth.install(m, false)
			s.ann.settle(m.Generation)
			s.log.Info("root loaded", "fingerprint", m.RootFingerprint(), "generation", m.Generation, "not_after", m.RootNotAfter())
			return s.Check(ctx)
		case errors.Is(err, jetstream.ErrKeyNotFound):
			st, err := s.newRoot(nil, nil, 1)
			if err != nil {
				return err
			}
			data, _ := json.Marshal(st)
			if _, err := kv.Create(ctx, RootKey, data); err != nil {
				if errors.Is(err, jetstream.ErrKeyExists) {
					continue // another replica won: load its root
				}
				return fmt.Errorf("store root: %w", err)
			}
			m, err := s.material(data)
			if err != nil {
				return err
			}
			s.auth.install(m, false)
			s.ann.settle(m.Generation)
			s.log.Info("root created", "fingerprint", m.RootFingerprint(), "not_after", m.RootNotAfter())
			return nil
		default:
			return fmt.Errorf("read root from kv: %w", err)
		}
	}
	return errors.New("root: could not create or load it")
}

// Announced is the highest bundle generation this replica knows to be announced
// with trust.changed (or to need no announcement: the one it started on).
func (s *SelfSigned) Announced() uint64 { return s.ann.announced() }

// AnnounceFailures counts failed attempts to publish trust.changed (each is retried).
func (s *SelfSigned) AnnounceFailures() uint64 { return s.ann.failures.Load() }

// Run follows root changes made by any replica, announces each new generation, and
// checks for rotation every CheckInterval, until ctx is done.
func (s *SelfSigned) Run(ctx context.Context) error {
	actx, stopAnnounce := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() { defer close(announced); s.ann.run(actx) }()
	defer func() { stopAnnounce(); <-announced }()
	w, err := s.kv.Watch(ctx, RootKey)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch root: %w", err)
	}
	defer func() { _ = w.Stop() }()
	t := time.NewTicker(s.cfg.CheckInterval)
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
			m, err := s.material(e.Value())
			if err != nil {
				s.log.Error("ignoring invalid root in kv", "revision", e.Revision(), "error", err)
				continue
			}
			if s.auth.install(m, false) {
				s.log.Info("root changed by another replica", "fingerprint", m.RootFingerprint(), "generation", m.Generation)
			}
			// Whoever wrote it may have failed to announce it: announce it too (same
			// event id, so JetStream keeps one).
			var st stored
			if json.Unmarshal(e.Value(), &st) == nil && st.Reason != "" {
				s.ann.observe(s.event(st, m))
			}
		case <-t.C:
			if err := s.Check(ctx); err != nil {
				s.log.Error("root check failed", "error", err)
			}
		}
	}
}

// Check rotates the root when less than GracePercent of its life is left, and drops
// expired old roots from the bundle.
func (s *SelfSigned) Check(ctx context.Context) error {
	m := s.auth.Current()
	if m == nil {
		return errors.New("no root loaded")
	}
	now := s.now()
	root := m.Roots[0]
	left := root.NotAfter.Sub(now)
	if s.due(root, now) {
		s.log.Info("root near expiry, rotating", "fingerprint", m.RootFingerprint(), "left", left.Round(time.Second), "not_after", root.NotAfter)
		_, err := s.update(ctx, events.TrustReasonRotation, func(st stored) (stored, bool, error) {
			return s.rotated(st, s.cfg.NewKeyOnRotate, true)
		})
		return err
	}
	for _, r := range m.Roots[1:] {
		if !r.NotAfter.After(now) {
			_, err := s.update(ctx, events.TrustReasonExpired, func(st stored) (stored, bool, error) {
				return s.pruned(st)
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

// Rotate issues a new root now (meshctl rotate root), with a new key when asked.
func (s *SelfSigned) Rotate(ctx context.Context, newKey bool) (*Material, error) {
	return s.update(ctx, events.TrustReasonRotation, func(st stored) (stored, bool, error) {
		return s.rotated(st, newKey || s.cfg.NewKeyOnRotate, false)
	})
}

// update applies change to the stored root with compare-and-set. When another replica
// changed it first, change is re-evaluated on the newer value (and may find nothing to do).
// The replica whose write wins queues trust.changed (Run publishes it, with retries).
func (s *SelfSigned) update(ctx context.Context, reason string, change func(stored) (stored, bool, error)) (*Material, error) {
	for attempt := 0; attempt < 5; attempt++ {
		e, err := s.kv.Get(ctx, RootKey)
		if err != nil {
			return nil, fmt.Errorf("read root: %w", err)
		}
		var st stored
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			return nil, fmt.Errorf("decode root: %w", err)
		}
		next, changed, err := change(st)
		if err != nil {
			return nil, err
		}
		if !changed {
			m, err := s.material(e.Value())
			if err == nil {
				s.auth.install(m, false)
			}
			return m, err
		}
		next.Reason = reason
		next.Added, next.Removed = diffStored(st, next)
		data, _ := json.Marshal(next)
		m, err := s.material(data)
		if err != nil {
			return nil, err
		}
		if _, err := s.kv.Update(ctx, RootKey, data, e.Revision()); err != nil {
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue
			}
			return nil, fmt.Errorf("store root: %w", err)
		}
		s.auth.install(m, false)
		s.log.Info("trust bundle changed", "reason", reason, "generation", m.Generation, "fingerprint", m.RootFingerprint(), "roots", len(m.Roots))
		s.ann.observe(s.event(next, m))
		return m, nil
	}
	return nil, errors.New("root: too many concurrent changes")
}

// event is the trust.changed announcing the stored generation st (material m).
func (s *SelfSigned) event(st stored, m *Material) events.TrustChanged {
	return events.TrustChanged{TrustDomain: s.cfg.TrustDomain, Roots: m.RootPEMs(), Added: st.Added, Removed: st.Removed, Reason: st.Reason, Generation: m.Generation}
}

// rotated returns st with a new current root. When onlyIfDue is set (the periodic
// check) and the stored root is not due — another replica rotated first — it is unchanged.
func (s *SelfSigned) rotated(st stored, newKey, onlyIfDue bool) (stored, bool, error) {
	now := s.now()
	roots, err := pki.ParseCertPEMs(st.Roots)
	if err != nil || len(roots) == 0 {
		return st, false, fmt.Errorf("stored roots: %v", err)
	}
	cur := roots[0]
	if onlyIfDue && !s.due(cur, now) {
		return st, false, nil
	}
	var key crypto.Signer
	if !newKey {
		if key, err = pki.ParseKeyPEM([]byte(st.KeyPEM)); err != nil {
			return st, false, fmt.Errorf("stored root key: %w", err)
		}
	}
	var keep []*x509.Certificate
	for _, r := range roots {
		if r.NotAfter.After(now) {
			keep = append(keep, r)
		}
	}
	next, err := s.newRoot(key, keep, st.Generation+1)
	return next, err == nil, err
}

// pruned returns st without the old roots that have expired.
func (s *SelfSigned) pruned(st stored) (stored, bool, error) {
	now := s.now()
	roots, err := pki.ParseCertPEMs(st.Roots)
	if err != nil || len(roots) == 0 {
		return st, false, fmt.Errorf("stored roots: %v", err)
	}
	next := stored{Generation: st.Generation + 1, KeyPEM: st.KeyPEM, Roots: []string{st.Roots[0]}}
	for i, r := range roots[1:] {
		if r.NotAfter.After(now) {
			next.Roots = append(next.Roots, st.Roots[i+1])
		}
	}
	return next, len(next.Roots) != len(st.Roots), nil
}

// newRoot makes a root certificate with key (a new key when nil) and returns the stored
// value with it first and older before it.
func (s *SelfSigned) newRoot(key crypto.Signer, older []*x509.Certificate, gen uint64) (stored, error) {
	var err error
	if key == nil {
		if key, err = pki.GenerateKey(s.cfg.KeyAlg); err != nil {
			return stored{}, fmt.Errorf("root key: %w", err)
		}
	}
	serial, err := randomSerial()
	if err != nil {
		return stored{}, err
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
		return stored{}, fmt.Errorf("create root: %w", err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key, true)
	if err != nil {
		return stored{}, err
	}
	root, _ := x509.ParseCertificate(der)
	st := stored{Generation: gen, KeyPEM: string(keyPEM), Roots: pki.CertPEMs([]*x509.Certificate{root})}
	st.Roots = append(st.Roots, pki.CertPEMs(older)...)
	return st, nil
}

// material builds signing material from a stored value. The root is ours, so it is
// checked for structure at its own notBefore; expiry is Check's job. Expired old
// roots are left out of the bundle.
func (s *SelfSigned) material(data []byte) (*Material, error) {
	var st stored
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("decode root: %w", err)
	}
	key, err := pki.ParseKeyPEM([]byte(st.KeyPEM))
	if err != nil {
		return nil, err
	}
	roots, err := pki.ParseCertPEMs(st.Roots)
	if err != nil || len(roots) == 0 {
		return nil, fmt.Errorf("%w: stored roots: %v", ErrInvalidMaterial, err)
	}
	now := s.now()
	bundle := roots[:1]
	for _, r := range roots[1:] {
		if r.NotAfter.After(now) {
			bundle = append(bundle, r)
		}
	}
	return NewMaterial(key, roots[0], nil, bundle, st.Generation, roots[0].NotBefore)
}

// diffStored names the roots added and removed between two stored values.
func diffStored(prev, next stored) (added, removed []string) {
	fps := func(st stored) map[string]bool {
		out := map[string]bool{}
		certs, _ := pki.ParseCertPEMs(st.Roots)
		for _, c := range certs {
			out[pki.Fingerprint(c)] = true
		}
		return out
	}
	had, has := fps(prev), fps(next)
	for fp := range has {
		if !had[fp] {
			added = append(added, fp)
		}
	}
	for fp := range had {
		if !has[fp] {
			removed = append(removed, fp)
		}
	}
	return added, removed
}
