package ca

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// RetireSlack is added to the longest leaf lifetime before a retired root leaves the
// bundle: it covers Backdate, clock skew between replicas and a replica that sees the
// rotation in KV a little late and signs one more leaf under the old root.
const RetireSlack = time.Minute

// Errors of a refused rotation: nothing is written and nothing announced.
var (
	ErrRotateTooSoon = errors.New("root rotation refused: too soon after the last one")
	ErrBundleFull    = errors.New("root rotation refused: the trust bundle is full")
)

// stored is the KV value: Istio's istio-ca-secret equivalent, with every private key
// sealed under the KEK (see sealedKey). Keys[0] is the key of Roots[0]; the others are
// the keys of older roots still in the bundle, kept to endorse bundles for pods that
// trust only those roots, and dropped when their roots leave.
type stored struct {
	Generation  uint64      `json:"generation"`
	TrustDomain string      `json:"trust_domain,omitempty"`
	Keys        []sealedKey `json:"sealed_keys,omitempty"`
	Roots       []string    `json:"roots"` // newest first; Roots[0] is the current root
	// Cross is Roots[0]'s key certified by Roots[1] (a rotation to a new key), while
	// Roots[1] is in the bundle: the intermediate of phases 1 and 2 (see Phase).
	Cross string `json:"cross,omitempty"`
	// ServingCross is the cross-signed certificate of the last rotation after its
	// parent root left the bundle: the CA's gRPC serving chain carries it until it
	// expires, for clients whose mounted root is still the retired one.
	ServingCross string `json:"serving_cross,omitempty"`
	// Whether the lifetimes of the current key's leaves (and the previous key's) are
	// counted from its first leaf (see Lives): a key made by this version.
	KeyTracked bool `json:"key_tracked,omitempty"`
	OldTracked bool `json:"old_tracked,omitempty"`
	// The change that made this generation, so that every replica announces it alike.
	Reason  string   `json:"reason,omitempty"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// record is a stored value opened: certificates parsed, keys unsealed.
type record struct {
	gen                    uint64
	roots                  []*x509.Certificate // newest first
	keys                   []crypto.Signer     // keys[0] is roots[0]'s
	cross                  *x509.Certificate   // roots[0]'s key certified by the root before that key (see keyStart); nil when settled
	servingCross           *x509.Certificate   // cross after its parent root left: served, never in a sign reply
	keyTracked, oldTracked bool                // see stored
	reason                 string
	added                  []string
	remove                 []string
}

// open decodes and unseals a stored value.
func (s *SelfSigned) open(data []byte) (record, error) {
	var st stored
	if err := json.Unmarshal(data, &st); err != nil {
		return record{}, fmt.Errorf("decode root: %w", err)
	}
	if st.TrustDomain != "" && st.TrustDomain != s.cfg.TrustDomain {
		return record{}, fmt.Errorf("the stored root belongs to trust domain %q, not %q (-trust-domain, -kv-bucket)", st.TrustDomain, s.cfg.TrustDomain)
	}
	roots, err := pki.ParseCertPEMs(st.Roots)
	if err != nil || len(roots) == 0 {
		return record{}, fmt.Errorf("%w: stored roots: %v", ErrInvalidMaterial, err)
	}
	rec := record{gen: st.Generation, roots: roots, reason: st.Reason, added: st.Added, remove: st.Removed,
		keyTracked: st.KeyTracked, oldTracked: st.OldTracked}
	if st.Cross != "" {
		cs, err := pki.ParseCertPEMs([]string{st.Cross})
		if err != nil || !sameKey(cs[0], roots[0]) || crossParent(roots, cs[0]) == nil {
			return record{}, fmt.Errorf("%w: the stored cross-signed certificate does not certify the current root's key under the previous root", ErrInvalidMaterial)
		}
		rec.cross = cs[0]
	}
	if st.ServingCross != "" {
		// Only while it certifies the current key: a later rotation supersedes it.
		if cs, err := pki.ParseCertPEMs([]string{st.ServingCross}); err == nil && sameKey(cs[0], roots[0]) {
			rec.servingCross = cs[0]
		}
	}
	if len(st.Keys) == 0 {
		return record{}, fmt.Errorf("%w: the stored root has no key", ErrInvalidMaterial)
	}
	for _, sk := range st.Keys {
		k, err := s.cfg.KEK.open(s.cfg.TrustDomain, sk)
		if err != nil {
			return record{}, err
		}
		rec.keys = append(rec.keys, k)
	}
	return rec, nil
}

// seal encodes rec with every key sealed.
func (s *SelfSigned) seal(rec record) ([]byte, error) {
	st := stored{Generation: rec.gen, TrustDomain: s.cfg.TrustDomain, Roots: pki.CertPEMs(rec.roots),
		Reason: rec.reason, Added: rec.added, Removed: rec.remove,
		KeyTracked: rec.keyTracked, OldTracked: rec.oldTracked}
	if rec.cross != nil {
		st.Cross = string(pki.EncodeCertPEM(rec.cross))
	}
	if rec.servingCross != nil {
		st.ServingCross = string(pki.EncodeCertPEM(rec.servingCross))
	}
	for _, k := range rec.keys {
		sk, err := s.cfg.KEK.seal(s.cfg.TrustDomain, k)
		if err != nil {
			return nil, err
		}
		st.Keys = append(st.Keys, sk)
	}
	return json.Marshal(st)
}

// materialOf builds signing material from rec for its phase now (see Phase), endorsed
// by every key it holds. The root is ours, so it is checked for structure at its own
// notBefore; removing old roots from the bundle is Check's job.
func (s *SelfSigned) materialOf(rec record) (*Material, error) {
	m, err := NewMaterial(rec.keys[0], rec.roots[0], nil, rec.roots, rec.gen, rec.roots[0].NotBefore)
	if err != nil {
		return nil, err
	}
	switch ph := s.phaseAt(rec, s.now()); ph {
	case PhaseCrossOldLast:
		err = m.withChain([]*x509.Certificate{rec.cross, crossParent(rec.roots, rec.cross)}, ph)
	case PhaseCrossNewLast:
		err = m.withChain([]*x509.Certificate{rec.cross, rec.roots[0]}, ph)
	}
	if err != nil {
		return nil, err
	}
	m.cross = rec.cross
	if sc := rec.servingCross; sc != nil && s.now().Before(sc.NotAfter) {
		m.servingCross = sc
	}
	if err := m.AddRoots(s.cfg.ExtraRoots); err != nil {
		return nil, err
	}
	if err := m.endorse(s.cfg.TrustDomain, rec.keys[1:]...); err != nil {
		return nil, fmt.Errorf("endorse bundle: %w", err)
	}
	return m, nil
}

// createdAt is when a root of ours was made (and the root before it retired).
func createdAt(root *x509.Certificate) time.Time { return root.NotBefore.Add(Backdate) }

// leavesAt is when rec.roots[i] (i > 0), succeeded by rec.roots[i-1], leaves the
// bundle: when no leaf it signed can still be valid, or when it expires, whichever
// comes first. After a same-key rotation that is one PhaseStep after its successor
// was made. The root the current key was rotated from stays through the phases and
// one more step (the leaves of phases 1 and 2, which chain to it through the
// cross-signed certificate), each as long as the longest leaf actually issued (Lives).
func (s *SelfSigned) leavesAt(rec record, i int) time.Time {
	root, next := rec.roots[i], rec.roots[i-1]
	if i == keyStart(rec.roots)+1 && !sameKey(root, next) {
		return s.oldLeaves(rec)
	}
	return s.leavesAfter(root, createdAt(next), !sameKey(root, next))
}

// oldLeaves is when the root the current key was rotated from leaves the bundle.
func (s *SelfSigned) oldLeaves(rec record) time.Time {
	j := keyStart(rec.roots)
	step1, step2 := s.steps(rec)
	var key time.Duration
	if rec.keyTracked {
		key = s.livesOf(rec.roots[0]).Key
	}
	t := createdAt(rec.roots[j]).Add(step1 + step2 + s.lifeOr(key) + RetireSlack)
	if old := rec.roots[j+1]; old.NotAfter.Before(t) {
		return old.NotAfter
	}
	return t
}

// leavesAfter is leavesAt for a root retired at retired, by a new key when newKey.
func (s *SelfSigned) leavesAfter(root *x509.Certificate, retired time.Time, newKey bool) time.Time {
	t := retired.Add(s.PhaseStep())
	if newKey {
		t = retired.Add(3 * s.PhaseStep())
	}
	if root.NotAfter.Before(t) {
		return root.NotAfter
	}
	return t
}

// pruned returns rec without the old roots whose time to leave has come (roots[i]
// retired when roots[i-1] was made) and without the keys no remaining root has, and
// the reason: root-retired, or root-expired when every root removed expired.
func (s *SelfSigned) pruned(rec record, now time.Time) (record, string) {
	next := rec
	next.roots = rec.roots[:1:1]
	reason := ""
	for i, r := range rec.roots[1:] {
		at := s.leavesAt(rec, i+1)
		if at.After(now) {
			next.roots = append(next.roots, r)
			continue
		}
		if at.Before(r.NotAfter) {
			reason = events.TrustReasonRetired
		} else if reason == "" {
			reason = events.TrustReasonExpired
		}
	}
	next.keys = keysOf(rec.keys, next.roots)
	if next.cross != nil && crossParent(next.roots, next.cross) == nil {
		// It certifies the current key under a root that left: no sign reply carries
		// it again, but the CA's serving chain does until it expires (with the old
		// root), so that a client whose mounted root is still the old one reaches the
		// CA and learns the new root from its reply (docs/rotation.md).
		next.servingCross, next.cross = next.cross, nil
	}
	return next, reason
}

// keysOf keeps the keys of roots, once each: keys[0] always, others when an older
// root has them.
func keysOf(keys []crypto.Signer, roots []*x509.Certificate) []crypto.Signer {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	has := func(ks []crypto.Signer, pub crypto.PublicKey) bool {
		for _, k := range ks {
			if e, ok := k.Public().(equaler); ok && e.Equal(pub) {
				return true
			}
		}
		return false
	}
	out := keys[:1:1]
	for _, k := range keys[1:] {
		if has(out, k.Public()) {
			continue
		}
		for _, r := range roots[1:] {
			if has([]crypto.Signer{k}, r.PublicKey) {
				out = append(out, k)
				break
			}
		}
	}
	return out
}

// rotated returns rec with a new current root made with key (a new key when nil),
// without the roots that leave the bundle by now. forced is meshctl rotate root:
// refused within -root-rotate-min-interval of the last rotation. A rotation that
// would leave more than MaxRoots roots in the bundle is refused.
func (s *SelfSigned) rotated(rec record, newKey, forced bool) (record, string, error) {
	now := s.now()
	last := createdAt(rec.roots[0])
	// The first root is no rotation: an operator may rotate right after start.
	if forced && rec.gen > 1 && s.cfg.RotateMinInterval > 0 && now.Before(last.Add(s.cfg.RotateMinInterval)) {
		return rec, "", fmt.Errorf("%w: the root was rotated at %s; the next rotation is allowed at %s (-root-rotate-min-interval %s)",
			ErrRotateTooSoon, last.UTC().Format(time.RFC3339), last.Add(s.cfg.RotateMinInterval).UTC().Format(time.RFC3339), s.cfg.RotateMinInterval)
	}
	// A rotation to a new key runs its phases to the end before the next new key:
	// pods that trusted the root before it must all have moved on. (A same-key
	// rotation meanwhile keeps the cross-signed certificate and the phases' clock.)
	if ph := s.phaseAt(rec, now); ph != PhaseSettled && newKey {
		settled := s.planOf(rec, now).Settled
		return rec, "", fmt.Errorf("%w: the last rotation to a new key is in phase %s; a new key is allowed at %s",
			ErrRotateTooSoon, ph, settled.UTC().Format(time.RFC3339))
	}
	keyChanges := newKey && rec.keys[0] != nil
	// The current root retires now; every old root stays until its time to leave.
	kept, oldest := 1, time.Time{}
	for i, r := range rec.roots {
		var at time.Time
		if i == 0 {
			at = s.leavesAfter(r, now, keyChanges)
		} else {
			at = s.leavesAt(rec, i)
		}
		if at.After(now) {
			kept++
			if oldest.IsZero() || at.Before(oldest) {
				oldest = at
			}
		}
	}
	if kept > MaxRoots {
		return rec, "", fmt.Errorf("%w: it would hold %d roots, at most %d; a root leaves it when no certificate it signed can still be valid (-max-ttl after it was retired), the next at %s",
			ErrBundleFull, kept, MaxRoots, oldest.UTC().Format(time.RFC3339))
	}
	key := rec.keys[0]
	if newKey {
		var err error
		if key, err = pki.GenerateKey(s.cfg.KeyAlg); err != nil {
			return rec, "", fmt.Errorf("root key: %w", err)
		}
	}
	root, err := s.newRoot(key)
	if err != nil {
		return rec, "", err
	}
	next := rec
	next.roots = append([]*x509.Certificate{root}, rec.roots...)
	next.keys = append([]crypto.Signer{key}, rec.keys...)
	if newKey {
		if next.cross, err = crossSign(root, rec.roots[0], rec.keys[0], now); err != nil {
			return rec, "", err
		}
		next.servingCross = nil // it certifies the key this rotation replaces
		// The new key's leaves are counted from its first; the old key's longest
		// sets phase 1 (unknown, so -max-ttl, when it was not counted from its first).
		next.keyTracked, next.oldTracked = true, rec.keyTracked
	}
	next, _ = s.pruned(next, now)
	return next, events.TrustReasonRotation, nil
}

// diffRoots names the roots added and removed between two bundles, by fingerprint.
func diffRoots(prev, next []*x509.Certificate) (added, removed []string) {
	fps := func(cs []*x509.Certificate) map[string]bool {
		out := map[string]bool{}
		for _, c := range cs {
			out[pki.Fingerprint(c)] = true
		}
		return out
	}
	had, has := fps(prev), fps(next)
	for _, c := range next {
		if fp := pki.Fingerprint(c); !had[fp] {
			added = append(added, fp)
		}
	}
	for _, c := range prev {
		if fp := pki.Fingerprint(c); !has[fp] {
			removed = append(removed, fp)
		}
	}
	return added, removed
}
