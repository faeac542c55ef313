package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Phase is where a rotation to a new root key stands. An Istio agent learns its
// roots only from the last PEM of its latest CreateCertificate reply and then trusts
// that root alone, so a new key is brought in in phases (docs/architecture.md, "Root
// rotation in phases"): leaves are signed by the new key from the start, and the
// chain above them carries the new key certified by the old root (the cross-signed
// intermediate), which verifies under either root; which root is the reply's last
// PEM moves from the old to the new one only once no leaf signed by the old key can
// still be valid, and the cross-signed intermediate leaves the chain only once no pod
// can still trust the old root alone.
type Phase int

const (
	// PhaseSettled: one key; chain [root]. Also every same-key rotation.
	PhaseSettled Phase = iota
	// PhaseCrossOldLast: new key signs; chain [cross, old root].
	PhaseCrossOldLast
	// PhaseCrossNewLast: new key signs; chain [cross, new root].
	PhaseCrossNewLast
)

func (p Phase) String() string {
	switch p {
	case PhaseCrossOldLast:
		return "1 cross-signed, old root last"
	case PhaseCrossNewLast:
		return "2 cross-signed, new root last"
	default:
		return "3 settled"
	}
}

// Phase is the rotation phase this material was built for.
func (m *Material) Phase() Phase { return m.phase }

// PhaseStep is the longest a phase lasts: the longest leaf lifetime allowed plus
// RetireSlack, so that every certificate issued before a phase began has expired
// (and its holder renewed) by the time the next one begins. Phases 1 and 2 last as
// long as the longest leaf actually issued before them (see Lives), at most this.
func (s *SelfSigned) PhaseStep() time.Duration { return s.cfg.MaxLeafTTL + RetireSlack }

// phaseAt is rec's phase at now: derived from the stored record and the clock only,
// so replicas agree on it (RetireSlack covers their skew).
func (s *SelfSigned) phaseAt(rec record, now time.Time) Phase {
	j := keyStart(rec.roots)
	if rec.cross == nil || j+1 >= len(rec.roots) {
		return PhaseSettled
	}
	t := createdAt(rec.roots[j])
	step1, step2 := s.steps(rec)
	switch {
	case now.Before(t.Add(step1)):
		return PhaseCrossOldLast
	case now.Before(t.Add(step1 + step2)):
		return PhaseCrossNewLast
	}
	return PhaseSettled
}

// Plan is the schedule of the latest rotation to a new key (meshctl rotate root).
type Plan struct {
	Phase    Phase
	Rotated  time.Time // the new key began signing (phase 1)
	NewLast  time.Time // the old root stops being the reply's last PEM (phase 2)
	Settled  time.Time // the cross-signed intermediate leaves the chain (phase 3)
	OldLeave time.Time // the old root leaves the bundle; zero when no old root is in it
	// What phases 1 and 2 last for: the longest leaf the old key signed, and the
	// longest signed in phase 1 so far (-max-ttl when not known).
	OldLongest, Phase1Longest time.Duration
}

// planOf is rec's plan at now.
func (s *SelfSigned) planOf(rec record, now time.Time) Plan {
	p := Plan{Phase: s.phaseAt(rec, now)}
	if len(rec.roots) < 2 {
		return p
	}
	j := keyStart(rec.roots)
	if j+1 >= len(rec.roots) { // same-key rotations only: the root before leaves one step after
		p.Rotated = createdAt(rec.roots[0])
		p.NewLast, p.Settled = p.Rotated, p.Rotated
		p.OldLeave = s.leavesAt(rec, 1)
		return p
	}
	p.Rotated = createdAt(rec.roots[j])
	step1, step2 := s.steps(rec)
	p.NewLast, p.Settled = p.Rotated.Add(step1), p.Rotated.Add(step1+step2)
	p.OldLeave = s.oldLeaves(rec)
	old, phase1 := s.livesBasis(rec)
	p.OldLongest, p.Phase1Longest = s.lifeOr(old), s.lifeOr(phase1)
	return p
}

// Plan is the schedule of the current root's rotation, from the stored record.
func (s *SelfSigned) Plan() Plan {
	if r := s.rec.Load(); r != nil {
		return s.planOf(*r, s.now())
	}
	return Plan{}
}

// keyStart is the index of the oldest root in a row of roots (newest first) that
// certify the current key: the root after it, if any, is the one the current key was
// cross-signed by, and the rotation to this key happened when roots[keyStart] was made.
func keyStart(roots []*x509.Certificate) int {
	j := 0
	for j+1 < len(roots) && sameKey(roots[j+1], roots[0]) {
		j++
	}
	return j
}

// crossParent is the root in roots that signed cross, or nil.
func crossParent(roots []*x509.Certificate, cross *x509.Certificate) *x509.Certificate {
	for _, r := range roots {
		if !sameKey(r, cross) && cross.CheckSignatureFrom(r) == nil {
			return r
		}
	}
	return nil
}

// sameKey reports whether two certificates certify one key.
func sameKey(a, b *x509.Certificate) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.PublicKey.(equaler)
	return ok && e.Equal(b.PublicKey)
}

// crossSign certifies root's key under prev (signed with prevKey): the same subject
// and key identifier as root, so that a leaf root signs chains to either root.
//
// Both key identifiers are set explicitly. The cross certificate's subject equals its
// issuer's (every root of a trust domain has one name), and for such a template Go's
// x509.CreateCertificate leaves the Authority Key Identifier out, taking it for
// self-signed; OpenSSL and BoringSSL then take it for a self-signed root too and fail
// every chain through it ("self-signed certificate in certificate chain"). With the
// AKI naming prev's key they look for prev, as Go does by signature.
func crossSign(root, prev *x509.Certificate, prevKey crypto.Signer, now time.Time) (*x509.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	ski, err := keyIDOf(root)
	if err != nil {
		return nil, err
	}
	aki, err := keyIDOf(prev)
	if err != nil {
		return nil, err
	}
	if bytes.Equal(ski, aki) {
		return nil, errors.New("cross-sign the new root: it has the key of the root it would be certified by")
	}
	notAfter := root.NotAfter
	if prev.NotAfter.Before(notAfter) {
		notAfter = prev.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               root.Subject,
		SubjectKeyId:          ski,
		AuthorityKeyId:        aki,
		NotBefore:             now.Add(-Backdate),
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              root.KeyUsage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, prev, root.PublicKey, prevKey)
	if err != nil {
		return nil, fmt.Errorf("cross-sign the new root: %w", err)
	}
	return x509.ParseCertificate(der)
}

// keyIDOf is c's Subject Key Identifier, or when c has none, the one Go would
// derive for its key (SHA-1 of the subjectPublicKey bits, RFC 5280 4.2.1.2 method 1).
func keyIDOf(c *x509.Certificate) ([]byte, error) {
	if len(c.SubjectKeyId) > 0 {
		return c.SubjectKeyId, nil
	}
	var spki struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(c.RawSubjectPublicKeyInfo, &spki); err != nil {
		return nil, fmt.Errorf("key identifier of %q: %w", c.Subject, err)
	}
	h := sha1.Sum(spki.PublicKey.Bytes)
	return h[:], nil
}

// withChain replaces what follows a leaf in a reply by above (signing key's
// certificate first, the root the reply names last). The fingerprint stays that of
// the signing key's own root, which every leaf verifies under.
func (m *Material) withChain(above []*x509.Certificate, phase Phase) error {
	m.ownInter = append([]string{}, m.IntermediatePEMs()...)
	m.Chain, m.phase = above, phase
	m.chainPEMs = pki.CertPEMs(above)
	if n := 2*pemBytes(m.chainPEMs) + pemBytes(m.rootPEMs); n > MaxMaterialBytes {
		return fmt.Errorf("%w: the trust bundle and chain take %d bytes (roots once, chain twice), at most %d", ErrInvalidMaterial, n, MaxMaterialBytes)
	}
	m.notAfter = above[0].NotAfter
	for _, c := range above {
		if c.NotAfter.Before(m.notAfter) {
			m.notAfter = c.NotAfter
		}
	}
	return nil
}

// installRec makes m (built from rec) current when it is a newer generation, or the
// same generation in another phase, and keeps rec for the phase checks.
func (s *SelfSigned) installRec(rec record, m *Material) bool {
	cur := s.auth.Current()
	force := cur != nil && cur.Generation == m.Generation && cur.phase != m.phase
	if !s.auth.install(m, force) {
		return false
	}
	s.rec.Store(&rec)
	return true
}

// Event is p as meshctl sees it.
func (p Plan) Event() *events.RotationPlan {
	n := map[Phase]int{PhaseCrossOldLast: 1, PhaseCrossNewLast: 2, PhaseSettled: 3}[p.Phase]
	return &events.RotationPlan{Phase: n, Rotated: p.Rotated, NewRootLast: p.NewLast, Settled: p.Settled, OldRootLeaves: p.OldLeave,
		OldKeyLongest: ceilSecs(p.OldLongest), Phase1Longest: ceilSecs(p.Phase1Longest)}
}

// RotationPlan is the schedule of the current rotation or, with dryRun, of the one
// Rotate(ctx, newKey) would make now (or its refusal), without writing anything.
func (s *SelfSigned) RotationPlan(ctx context.Context, newKey, dryRun bool) (*events.RotationPlan, error) {
	if !dryRun {
		return s.Plan().Event(), nil
	}
	rec, _, err := s.readRoot(ctx)
	if err != nil {
		return nil, err
	}
	// The lifetimes other replicas recorded reach this one through the watch, a few
	// milliseconds behind; the dry run reads them where they are kept, so that it
	// says what the rotation would be now rather than what this replica has heard.
	if err := s.loadLives(ctx, rec); err != nil {
		return nil, err
	}
	next, _, err := s.rotated(rec, newKey || s.cfg.NewKeyOnRotate, true)
	if err != nil {
		return nil, err
	}
	return s.planOf(next, s.now()).Event(), nil
}
