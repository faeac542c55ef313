// Package trustbundle keeps the CA roots a service trusts and decides whether a
// trust bundle heard on the bus may change them: after a bootstrap from configured
// anchors (or, without anchors, trust on first use), a bundle is applied only when
// one of its endorsements verifies under a root trusted now (pki.VerifyEndorsement),
// so that a bus client without a CA key can neither add nor remove a root. The same
// set checks that a certificate chain ends at a trusted root.
package trustbundle

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Mode is how the first bundle is trusted.
type Mode string

const (
	// Anchors: the first bundle must be endorsed by a configured anchor, or hold
	// nothing but anchors.
	Anchors Mode = "anchors"
	// FirstUse: the first bundle is taken as it is (trust on first use).
	FirstUse Mode = "first-use"
)

// Bundle is a trust bundle as heard: from trust.changed, a bundle reply or a sign reply.
type Bundle struct {
	TrustDomain  string
	Generation   uint64
	Roots        []string // PEM, newest first: what the endorsements sign
	Removed      []string // fingerprints said to be gone (trust.changed)
	Endorsements []events.Endorsement
	// Whole: Roots are the CA's whole bundle at Generation (the signer's gRPC
	// header, events.TrustBundleHeader), so a trusted root not among them is
	// removed when the bundle is applied. The endorsement covers the roots and the
	// generation, so only the CA's key can say what is left out.
	Whole bool
}

// FromTrustChanged, FromBundleReply and FromSignReply take the bundle of an event.
func FromTrustChanged(ev events.TrustChanged) Bundle {
	return Bundle{TrustDomain: ev.TrustDomain, Generation: ev.Generation, Roots: ev.Roots, Removed: ev.Removed, Endorsements: ev.Endorsements}
}

func FromBundleReply(r events.BundleReply) Bundle {
	return Bundle{TrustDomain: r.TrustDomain, Generation: r.Generation, Roots: r.Roots, Endorsements: r.Endorsements}
}

func FromSignReply(r events.SignReply) Bundle {
	return Bundle{TrustDomain: r.TrustDomain, Generation: r.Generation, Roots: r.Roots, Endorsements: r.Endorsements}
}

// Errors of Check. Every refusal wraps ErrRejected.
var (
	ErrRejected    = errors.New("trust bundle rejected")
	ErrTrustDomain = fmt.Errorf("%w: wrong trust domain", ErrRejected)
)

// Update is a bundle Check found acceptable, to be applied with Apply.
type Update struct {
	Roots      []*x509.Certificate
	Removed    []string
	Generation uint64
	// Stale: an older generation (or the current one again): nothing to apply.
	Stale bool
	// FirstUse: the bundle was taken on first use, without verification.
	FirstUse bool
	// Endorser is the key id whose endorsement verified ("" on first use or for
	// a bundle of anchors only).
	Endorser string
}

// Set is the trusted roots. It is safe for concurrent use.
type Set struct {
	td      string
	clk     clock.Clock
	anchors []*x509.Certificate

	mu    sync.Mutex
	boot  bool                         // a first bundle has been accepted
	roots map[string]*x509.Certificate // by fingerprint
	order map[string]int               // first-seen order, newest highest
	seq   int
	gen   uint64
}

// New returns an empty set for trustDomain ("" accepts any) that bootstraps from
// anchors, or on first use when there are none. clk tells the time to drop
// expired roots; nil: the wall clock.
func New(trustDomain string, anchors []*x509.Certificate, clk clock.Clock) *Set {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Set{td: trustDomain, clk: clk, anchors: slices.Clone(anchors),
		roots: map[string]*x509.Certificate{}, order: map[string]int{}}
}

// Mode says how the first bundle is (or was) trusted.
func (s *Set) Mode() Mode {
	if len(s.anchors) > 0 {
		return Anchors
	}
	return FirstUse
}

// Bootstrapped reports whether a first bundle has been accepted.
func (s *Set) Bootstrapped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boot
}

// Generation is the last generation applied.
func (s *Set) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// Has reports whether the root with fingerprint fp is trusted now.
func (s *Set) Has(fp string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune()
	_, ok := s.roots[fp]
	return ok
}

// Roots returns the trusted roots, newest first, without expired ones.
func (s *Set) Roots() []*x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune()
	return s.list()
}

// Pool returns the trusted roots as a pool, nil when there are none.
func (s *Set) Pool() *x509.CertPool {
	roots := s.Roots()
	if len(roots) == 0 {
		return nil
	}
	p := x509.NewCertPool()
	for _, r := range roots {
		p.AddCert(r)
	}
	return p
}

// Check decides whether b may be applied, changing nothing. A bundle of an older
// generation than the last applied (or of the same one) is Stale, not an error:
// generation 0 is taken only while no other has been applied. A newer one needs an
// endorsement that verifies under a root trusted now; before the first bundle, under
// an anchor (or it holds nothing but anchors and is not Whole), or nothing on first
// use. A Whole bundle's update removes the trusted roots it leaves out.
func (s *Set) Check(b Bundle) (Update, error) {
	if s.td != "" && b.TrustDomain != s.td {
		return Update{}, fmt.Errorf("%w: %q, not %q", ErrTrustDomain, b.TrustDomain, s.td)
	}
	roots, err := pki.ParseCertPEMs(b.Roots)
	if err != nil {
		return Update{}, fmt.Errorf("%w: roots: %w", ErrRejected, err)
	}
	if len(roots) == 0 {
		return Update{}, fmt.Errorf("%w: no roots", ErrRejected)
	}
	u := Update{Roots: roots, Generation: b.Generation}
	for _, fp := range b.Removed {
		// The endorsement covers the roots, not Removed: never remove what the
		// bundle itself lists.
		if !slices.ContainsFunc(roots, func(c *x509.Certificate) bool { return pki.Fingerprint(c) == fp }) {
			u.Removed = append(u.Removed, fp)
		}
	}
	s.mu.Lock()
	s.prune()
	boot, gen, trusted := s.boot, s.gen, s.list()
	s.mu.Unlock()
	if boot && b.Generation <= gen && (b.Generation != 0 || gen != 0) {
		u.Stale = true
		return u, nil
	}
	if b.Whole {
		u.Removed = left(trusted, roots, u.Removed)
	}
	if !boot {
		if len(s.anchors) == 0 {
			u.FirstUse = true
			return u, nil
		}
		if onlyAnchors(roots, s.anchors) && !b.Whole {
			// A whole bundle leaves anchors out: only an endorsement says which.
			return u, nil
		}
		trusted = s.anchors
	}
	if u.Endorser, err = endorsed(trusted, b); err != nil {
		return Update{}, err
	}
	return u, nil
}

// Endorsed checks only that one of b's endorsements verifies under a root trusted
// now, whatever its generation: for a consumer that acts on old news too.
func (s *Set) Endorsed(b Bundle) error {
	_, err := endorsed(s.Roots(), b)
	return err
}

// Endorse signs the bundle (trustDomain, gen, roots) with each key: the
// endorsements a receiver's Check verifies. A CA key makes them (the signer keeps
// its own variant, with the intermediate's chain); tests make them for their CAs.
func Endorse(trustDomain string, gen uint64, roots []string, keys ...crypto.Signer) ([]events.Endorsement, error) {
	msg, err := events.EndorsedBytes(trustDomain, gen, roots)
	if err != nil {
		return nil, err
	}
	return endorseBytes(msg, keys)
}

// endorseBytes signs msg with each key.
func endorseBytes(msg []byte, keys []crypto.Signer) ([]events.Endorsement, error) {
	out := make([]events.Endorsement, 0, len(keys))
	for _, k := range keys {
		id, sig, err := pki.Endorse(k, msg)
		if err != nil {
			return nil, err
		}
		out = append(out, events.Endorsement{KeyID: id, Signature: sig})
	}
	return out, nil
}

// endorsed returns the key id of the first endorsement of b that verifies under trusted.
func endorsed(trusted []*x509.Certificate, b Bundle) (string, error) {
	if len(b.Endorsements) == 0 {
		return "", fmt.Errorf("%w: not endorsed", ErrRejected)
	}
	msg, err := events.EndorsedBytes(b.TrustDomain, b.Generation, b.Roots)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrRejected, err)
	}
	var errs []error
	for i, e := range b.Endorsements {
		chain, err := pki.ParseCertPEMs(e.Chain)
		if err == nil {
			err = pki.VerifyEndorsement(trusted, msg, e.KeyID, e.Signature, chain)
		}
		if err == nil {
			return e.KeyID, nil
		}
		errs = append(errs, fmt.Errorf("endorsements[%d]: %w", i, err))
	}
	return "", fmt.Errorf("%w: %w", ErrRejected, errors.Join(errs...))
}

// left appends to removed the fingerprint of each trusted root that is not in
// roots and not in removed already.
func left(trusted, roots []*x509.Certificate, removed []string) []string {
	for _, c := range trusted {
		if fp := pki.Fingerprint(c); !slices.ContainsFunc(roots, c.Equal) && !slices.Contains(removed, fp) {
			removed = append(removed, fp)
		}
	}
	return removed
}

func onlyAnchors(roots, anchors []*x509.Certificate) bool {
	for _, r := range roots {
		if !slices.ContainsFunc(anchors, r.Equal) {
			return false
		}
	}
	return true
}

// Apply applies an update from Check: it merges the roots (an old root stays
// trusted until it expires or a bundle says it is removed, or leaves it out of
// a Whole bundle) and records the
// generation. It reports whether the trusted roots changed. A stale update, or one
// overtaken by a newer generation since Check, changes nothing.
func (s *Set) Apply(u Update) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.Stale || (s.boot && u.Generation <= s.gen && (u.Generation != 0 || s.gen != 0)) {
		return false
	}
	s.boot = true
	s.gen = u.Generation
	changed := false
	for _, fp := range u.Removed {
		if _, ok := s.roots[fp]; ok {
			delete(s.roots, fp)
			changed = true
		}
	}
	// Newest first in the input: give earlier entries higher order.
	for i := len(u.Roots) - 1; i >= 0; i-- {
		fp := pki.Fingerprint(u.Roots[i])
		if _, ok := s.roots[fp]; !ok {
			s.roots[fp] = u.Roots[i]
			s.seq++
			s.order[fp] = s.seq
			changed = true
		}
	}
	return changed
}

// Accept is Check then Apply.
func (s *Set) Accept(b Bundle) (Update, bool, error) {
	u, err := s.Check(b)
	if err != nil {
		return u, false, err
	}
	return u, s.Apply(u), nil
}

// ErrUntrustedChain says that a chain does not verify to a trusted root.
var ErrUntrustedChain = errors.New("chain does not verify to a trusted root")

// VerifyChain checks that chain[0] verifies at time at, through chain[1:], to a
// trusted root or one of extra (the roots of an update not applied yet). A root at
// the end of chain is trusted only if it is one of those.
func (s *Set) VerifyChain(chain, extra []*x509.Certificate, at time.Time) error {
	_, err := s.VerifyChainRoots(chain, extra, at)
	return err
}

// VerifyChainRoots is VerifyChain that also returns the roots the chain verified
// to (more than one only when roots share a name and key), so that a caller
// needs no second signature check to learn which root it was.
func (s *Set) VerifyChainRoots(chain, extra []*x509.Certificate, at time.Time) ([]*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, fmt.Errorf("%w: empty chain", ErrUntrustedChain)
	}
	rp, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range append(s.Roots(), extra...) {
		rp.AddCert(r)
	}
	for _, c := range chain[1:] {
		ip.AddCert(c)
	}
	chains, err := chain[0].Verify(x509.VerifyOptions{Roots: rp, Intermediates: ip, CurrentTime: at,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUntrustedChain, err)
	}
	var roots []*x509.Certificate
	for _, c := range chains {
		if r := c[len(c)-1]; !slices.ContainsFunc(roots, r.Equal) {
			roots = append(roots, r)
		}
	}
	return roots, nil
}

// prune drops expired roots; s.mu is held.
func (s *Set) prune() {
	now := s.clk.Now()
	for fp, c := range s.roots {
		if now.After(c.NotAfter) {
			delete(s.roots, fp)
		}
	}
}

// list returns the roots newest first; s.mu is held.
func (s *Set) list() []*x509.Certificate {
	fps := make([]string, 0, len(s.roots))
	for fp := range s.roots {
		fps = append(fps, fp)
	}
	sort.Slice(fps, func(i, j int) bool { return s.order[fps[i]] > s.order[fps[j]] })
	out := make([]*x509.Certificate, len(fps))
	for i, fp := range fps {
		out[i] = s.roots[fp]
	}
	return out
}

// ErrNotCertified says that a root offered without an endorsement is not certified
// by a trusted root.
var ErrNotCertified = fmt.Errorf("%w: the new root's key is not certified under a trusted root", ErrRejected)

// Certified returns the roots at the end of chain that are not trusted yet but whose
// key a trusted root has certified, at time at, through a CA certificate in chain
// of the same name and key (the cross-signed certificate of a rotation to a new
// key: Istio's CreateCertificate reply carries no endorsement, and in phase 2 it is
// [leaf, cross, new root]). The old root's key vouches for the new root's key this
// way as it does by endorsing a bundle. extra are roots trusted as well (an update
// not applied yet). Nothing is changed; AddCertified applies.
func (s *Set) Certified(chain, extra []*x509.Certificate, at time.Time) ([]*x509.Certificate, error) {
	if len(chain) < 2 {
		return nil, nil
	}
	root := chain[len(chain)-1]
	if s.Has(pki.Fingerprint(root)) || slices.ContainsFunc(extra, root.Equal) || !root.IsCA || root.CheckSignatureFrom(root) != nil {
		return nil, nil // trusted already, or no self-signed root at the end
	}
	if at.Before(root.NotBefore) || at.After(root.NotAfter) {
		return nil, fmt.Errorf("%w: the new root is not valid at %s", ErrNotCertified, at.Format(time.RFC3339))
	}
	trusted := x509.NewCertPool()
	for _, r := range append(s.Roots(), extra...) {
		trusted.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1 : len(chain)-1] {
		inter.AddCert(c)
	}
	for _, c := range chain[1 : len(chain)-1] {
		if !c.IsCA || !bytes.Equal(c.RawSubject, root.RawSubject) || !sameKey(c.PublicKey, root.PublicKey) {
			continue
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: trusted, Intermediates: inter, CurrentTime: at,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
			return []*x509.Certificate{root}, nil
		}
	}
	return nil, ErrNotCertified
}

// AddCertified trusts roots that Certified returned, keeping the generation; it
// reports whether the trusted roots changed.
func (s *Set) AddCertified(roots []*x509.Certificate) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, r := range roots {
		fp := pki.Fingerprint(r)
		if _, ok := s.roots[fp]; !ok {
			s.roots[fp] = r
			s.seq++
			s.order[fp] = s.seq
			changed = true
		}
	}
	return changed
}

func sameKey(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}

// CheckUnder is Check for a service whose trusted roots another part keeps (xds-relay
// trusts what its sds-edge serves as ROOTCA): b must be of trustDomain ("" accepts
// any) and carry an endorsement that verifies under trusted, or hold nothing but
// trusted roots. There is no first use: with nothing trusted, nothing is accepted.
// It returns b's roots.
func CheckUnder(trustDomain string, trusted []*x509.Certificate, b Bundle) ([]*x509.Certificate, error) {
	if len(trusted) == 0 {
		return nil, fmt.Errorf("%w: no trusted roots to check it under", ErrRejected)
	}
	s := New(trustDomain, trusted, nil)
	u, err := s.Check(b)
	if err != nil {
		return nil, err
	}
	return u.Roots, nil
}

// Restore trusts roots at generation gen as if a bundle had been applied, when none
// has been yet: the bundle a service checked and kept before (its own store, written
// only by it), so that a restart or a takeover is no first use again. A later bundle
// is checked against these roots. It reports whether it restored them.
func (s *Set) Restore(roots []*x509.Certificate, gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.boot || len(roots) == 0 {
		return false
	}
	s.boot, s.gen = true, gen
	for i := len(roots) - 1; i >= 0; i-- {
		fp := pki.Fingerprint(roots[i])
		if _, ok := s.roots[fp]; !ok {
			s.roots[fp] = roots[i]
			s.seq++
			s.order[fp] = s.seq
		}
	}
	return true
}
