package ca

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go/jetstream"
)

// Lives are the lifetimes of the leaves one CA key actually signed, which decide how
// long a rotation's phases last: a phase must outlast every leaf signed before it
// began, and that is the longest one signed, not -max-ttl, which on a fleet of 24 h
// certificates under a 90-day maximum would make a rotation take months. Each key
// has its own KV entry (LivesKeyPrefix + key id, beside the root record, which they
// leave alone), raised by whichever replica is about to sign a longer leaf, and
// followed by every replica through the watch. 0 means none counted.
type Lives struct {
	Key    time.Duration `json:"-"` // longest leaf the key signed
	Phase1 time.Duration `json:"-"` // longest it signed in phase 1 of the rotation to it

	KeyS    int64 `json:"key_longest_s,omitempty"`
	Phase1S int64 `json:"phase1_longest_s,omitempty"`
}

// LivesKeyPrefix starts the KV key of a CA key's Lives.
const LivesKeyPrefix = "lives."

func ceilSecs(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

func keyIDOfCert(c *x509.Certificate) string {
	id, err := pki.KeyID(c.PublicKey)
	if err != nil {
		return ""
	}
	return id
}

// certKeyID is a certificate's key id, remembered (SelfSigned.keyID).
type certKeyID struct {
	cert *x509.Certificate
	id   string
}

// keyID is keyIDOfCert, remembered for the last certificate asked about: NoteLife
// asks for the current root's before every leaf, and the id (a DER encoding and a
// SHA-256) cost ~9 µs of a ~300 µs CSR.
func (s *SelfSigned) keyID(c *x509.Certificate) string {
	if k := s.lastKeyID.Load(); k != nil && k.cert == c {
		return k.id
	}
	id := keyIDOfCert(c)
	s.lastKeyID.Store(&certKeyID{cert: c, id: id})
	return id
}

// livesOf is what is known of the leaves root's key signed.
func (s *SelfSigned) livesOf(root *x509.Certificate) Lives {
	s.livesMu.Lock()
	defer s.livesMu.Unlock()
	return s.lives[s.keyID(root)]
}

// learnLives merges l for key id (never lowering what is known).
func (s *SelfSigned) learnLives(id string, l Lives) {
	s.livesMu.Lock()
	defer s.livesMu.Unlock()
	if s.lives == nil {
		s.lives = map[string]Lives{}
	}
	cur := s.lives[id]
	cur.Key, cur.Phase1 = max(cur.Key, l.Key), max(cur.Phase1, l.Phase1)
	s.lives[id] = cur
}

// followLives learns a Lives entry read from KV (a put of LivesKeyPrefix + id).
func (s *SelfSigned) followLives(key string, value []byte) {
	var l Lives
	if err := json.Unmarshal(value, &l); err != nil {
		s.log.Warn("ignoring an unreadable leaf lifetime record", "key", key, "error", err)
		return
	}
	l.Key, l.Phase1 = time.Duration(l.KeyS)*time.Second, time.Duration(l.Phase1S)*time.Second
	s.learnLives(strings.TrimPrefix(key, LivesKeyPrefix), l)
}

// loadLives reads the Lives of the keys of rec's roots (at start, and for a dry run).
func (s *SelfSigned) loadLives(ctx context.Context, rec record) error {
	for _, r := range rec.roots {
		k := LivesKeyPrefix + keyIDOfCert(r)
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", k, err)
		}
		s.followLives(k, e.Value())
	}
	return nil
}

// lifeOr is d as a phase's basis: -max-ttl when unknown or longer.
func (s *SelfSigned) lifeOr(d time.Duration) time.Duration {
	if d <= 0 || d > s.cfg.MaxLeafTTL {
		return s.cfg.MaxLeafTTL
	}
	return d
}

// livesBasis is what rec's phases 1 and 2 are built on: the longest leaf the
// previous key signed (0 when it was not counted from its first), and the longest
// the current key signed in phase 1.
func (s *SelfSigned) livesBasis(rec record) (old, phase1 time.Duration) {
	j := keyStart(rec.roots)
	if j+1 < len(rec.roots) && rec.oldTracked {
		old = s.livesOf(rec.roots[j+1]).Key
	}
	return old, s.livesOf(rec.roots[0]).Phase1
}

// steps are the lengths of phase 1 (until no leaf of the old key is valid) and phase
// 2 (until no leaf whose reply ended at the old root is valid) of rec's rotation.
func (s *SelfSigned) steps(rec record) (phase1, phase2 time.Duration) {
	old, p1 := s.livesBasis(rec)
	return s.lifeOr(old) + RetireSlack, s.lifeOr(p1) + RetireSlack
}

// raised is l raised for a leaf of lifetime life signed under rec at now, and
// whether anything changed.
func (s *SelfSigned) raised(rec record, l Lives, life time.Duration, now time.Time) (Lives, bool) {
	changed := false
	if life > l.Key {
		l.Key, changed = life, true
	}
	if life > l.Phase1 && s.phaseAt(rec, now) == PhaseCrossOldLast {
		l.Phase1, changed = life, true
	}
	return l, changed
}

// ErrLifeNotRecorded is returned when a longer leaf than any before could not be
// recorded: it is not signed (the caller retries), or a phase could end under it.
var ErrLifeNotRecorded = errors.New("the longest leaf lifetime could not be recorded")

// NoteLife records, before a leaf is signed with the current key, that one of
// lifetime life (its NotAfter - NotBefore) is about to be: nothing to do unless it
// is the longest of its key, or of phase 1. The write is compare-and-set on the
// key's Lives entry; the root record and the bundle do not change.
func (s *SelfSigned) NoteLife(ctx context.Context, life time.Duration) error {
	rec := s.rec.Load()
	if rec == nil {
		return nil
	}
	id := s.keyID(rec.roots[0])
	if _, changed := s.raised(*rec, s.livesOf(rec.roots[0]), life, s.now()); !changed {
		return nil
	}
	k := LivesKeyPrefix + id
	for attempt := 0; attempt < 5; attempt++ {
		var stored Lives
		var rev uint64
		e, err := s.kv.Get(ctx, k)
		switch {
		case err == nil:
			if err := json.Unmarshal(e.Value(), &stored); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrLifeNotRecorded, k, err)
			}
			stored.Key, stored.Phase1 = time.Duration(stored.KeyS)*time.Second, time.Duration(stored.Phase1S)*time.Second
			rev = e.Revision()
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return fmt.Errorf("%w: read %s: %w", ErrLifeNotRecorded, k, err)
		}
		next, changed := s.raised(*rec, stored, life, s.now())
		if !changed {
			s.learnLives(id, stored)
			return nil
		}
		next.KeyS, next.Phase1S = ceilSecs(next.Key), ceilSecs(next.Phase1)
		data, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrLifeNotRecorded, err)
		}
		if rev == 0 {
			_, err = s.kv.Create(ctx, k, data)
		} else {
			_, err = s.kv.Update(ctx, k, data, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another replica raised it first: look again
		}
		if err != nil {
			return fmt.Errorf("%w: store %s: %w", ErrLifeNotRecorded, k, err)
		}
		next.Key, next.Phase1 = time.Duration(next.KeyS)*time.Second, time.Duration(next.Phase1S)*time.Second
		s.learnLives(id, next)
		return nil
	}
	return fmt.Errorf("%w: too many concurrent changes", ErrLifeNotRecorded)
}
