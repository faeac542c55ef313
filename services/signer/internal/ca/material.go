// Package ca holds the signer's CA material — plugged in from an Istio cacerts
// directory or a self-signed root kept in JetStream KV — keeps it current (reloads,
// root rotation, changes made by other replicas) and signs workload certificates.
package ca

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Material is one immutable set of CA material.
type Material struct {
	Key        crypto.Signer
	Cert       *x509.Certificate   // signs leaves
	Chain      []*x509.Certificate // Cert, intermediates..., root: what follows a leaf in a reply
	Roots      []*x509.Certificate // the trust bundle, newest first
	Generation uint64              // increases with every change of the bundle or chain

	chainPEMs    []string
	rootPEMs     []string
	rootFP       string
	notAfter     time.Time
	endorsements []events.Endorsement
	phase        Phase               // of a rotation to a new key (self-signed only)
	ownInter     []string            // intermediates under the signing key's own root (see withChain)
	cross        *x509.Certificate   // the current key certified by the old root, while that root is in the bundle
	servingCross *x509.Certificate   // the same after the old root left, until it expires: served only
	given        []*x509.Certificate // the intermediates given (cert-chain.pem), whether in Chain or not
}

// ServingIntermediates is what a TLS server whose certificate this material signed
// sends after it: the chain above a leaf without its root and, after phase 2 of a
// rotation to a new key until the old root leaves the bundle, the cross-signed
// certificate, so that a client still trusting only the old root (an Istio agent
// restarted with the mounted root of before) verifies the CA's own endpoint — and
// after the old root left the bundle, until the cross-signed certificate expires
// (with the old root): a pod started then with a stale mounted root still reaches
// the CA, and learns the new root from its reply.
func (m *Material) ServingIntermediates() []*x509.Certificate {
	out := append([]*x509.Certificate{}, m.Chain[:len(m.Chain)-1]...)
	for _, c := range []*x509.Certificate{m.cross, m.servingCross} {
		if c != nil && !slices.ContainsFunc(out, c.Equal) {
			out = append(out, c)
		}
	}
	return out
}

// MaxRoots bounds the trust bundle: a self-signed rotation that would make it larger
// is refused, and plugged-in material with more roots is invalid. With MaxMaterialBytes
// it keeps every reply and event that carries the bundle under events.MaxEventSize.
const MaxRoots = 8

// MaxMaterialBytes bounds the PEM bytes of the bundle plus twice the chain above a
// leaf (a sign reply carries the chain, and its endorsement the chain again), leaving
// room under events.MaxEventSize for the leaf, the endorsements' signatures and JSON.
const MaxMaterialBytes = 40 << 10

// ErrInvalidMaterial wraps every reason CA material is refused.
var ErrInvalidMaterial = errors.New("invalid CA material")

// NewMaterial checks that key belongs to cert, that cert may sign certificates and that
// it chains through intermediates to one of roots at now, and returns the material.
func NewMaterial(key crypto.Signer, cert *x509.Certificate, intermediates, roots []*x509.Certificate, gen uint64, now time.Time) (*Material, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidMaterial, fmt.Sprintf(format, a...))
	}
	if key == nil || cert == nil || len(roots) == 0 {
		return nil, bad("key, certificate and at least one root are required")
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := key.Public().(equaler); !ok || !pub.Equal(cert.PublicKey) {
		return nil, bad("private key does not match the CA certificate %q", cert.Subject)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, bad("certificate %q is not a CA", cert.Subject)
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, bad("certificate %q may not sign certificates", cert.Subject)
	}
	rootPool, interPool := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	for _, c := range intermediates {
		interPool.AddCert(c)
	}
	chains, err := cert.Verify(x509.VerifyOptions{
		Roots: rootPool, Intermediates: interPool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, bad("CA certificate %q does not chain to a root: %v", cert.Subject, err)
	}
	if len(roots) > MaxRoots {
		return nil, bad("the trust bundle holds %d roots, at most %d", len(roots), MaxRoots)
	}
	m := &Material{Key: key, Cert: cert, Chain: chains[0], Roots: roots, Generation: gen, given: intermediates}
	m.chainPEMs = pki.CertPEMs(m.Chain)
	m.rootPEMs = pki.CertPEMs(m.Roots)
	if n := 2*pemBytes(m.chainPEMs) + pemBytes(m.rootPEMs); n > MaxMaterialBytes {
		return nil, bad("the trust bundle and chain take %d bytes (roots once, chain twice), at most %d", n, MaxMaterialBytes)
	}
	m.rootFP = pki.Fingerprint(m.Chain[len(m.Chain)-1])
	m.notAfter = m.Chain[0].NotAfter
	for _, c := range m.Chain {
		if c.NotAfter.Before(m.notAfter) {
			m.notAfter = c.NotAfter
		}
	}
	return m, nil
}

func pemBytes(pems []string) int {
	n := 0
	for _, p := range pems {
		n += len(p)
	}
	return n
}

// ChainPEMs is the chain above a leaf, signing cert first, root last.
func (m *Material) ChainPEMs() []string { return m.chainPEMs }

// IntermediatePEMs is the chain above a leaf without its root: signing cert first;
// empty when the signing cert is the root itself. During a rotation's phases it is
// the chain under the signing key's own root, without the cross-signed certificate
// the reply carries (so cert.issued names a chain that ends at RootFingerprint).
func (m *Material) IntermediatePEMs() []string {
	if m.ownInter != nil {
		return m.ownInter
	}
	return m.chainPEMs[:len(m.chainPEMs)-1]
}

// Endorsements vouch for the bundle (events.EndorsedBytes of the trust domain,
// Generation and RootPEMs): one by the signing key, with the chain up to the root,
// and one by each other key given to endorse (the keys of older roots still in the
// bundle), so that a pod trusting only an older root can follow.
func (m *Material) Endorsements() []events.Endorsement { return m.endorsements }

// endorse signs the bundle with the signing key and with others (duplicates of a
// key are skipped). It is called once, before the material is installed.
func (m *Material) endorse(trustDomain string, others ...crypto.Signer) error {
	msg, err := events.EndorsedBytes(trustDomain, m.Generation, m.rootPEMs)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var out []events.Endorsement
	for i, k := range append([]crypto.Signer{m.Key}, others...) {
		id, err := pki.KeyID(k.Public())
		if err != nil {
			return err
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		id, sig, err := pki.Endorse(k, msg)
		if err != nil {
			return err
		}
		e := events.Endorsement{KeyID: id, Signature: sig}
		if i == 0 {
			e.Chain = m.endorsementChain()
		}
		out = append(out, e)
	}
	m.endorsements = out
	return nil
}

// EndorseSigner vouches for named signer's roots (Istio's CERT_SIGNERS, a CA of
// its own) to the pods that ask for it: the mesh CA's signing key signs
// events.SignerEndorsedBytes, with the chain up to the mesh root as a bundle
// endorsement carries it, so that a pod accepts a chain ending at one of them.
func (m *Material) EndorseSigner(trustDomain, name string, named *Material) (*events.SignerRoots, error) {
	roots := named.RootPEMs()
	msg, err := events.SignerEndorsedBytes(trustDomain, name, roots)
	if err != nil {
		return nil, err
	}
	id, sig, err := pki.Endorse(m.Key, msg)
	if err != nil {
		return nil, err
	}
	e := events.Endorsement{KeyID: id, Signature: sig, Chain: m.endorsementChain()}
	return &events.SignerRoots{Name: name, Roots: roots, Endorsements: []events.Endorsement{e}}, nil
}

// endorsementChain is what the signing key's endorsement carries to a root: the
// intermediates, then the other CA certificates given that are no self-signed root
// (a new root cross-signed by the current one, in cert-chain.pem), so that a pod
// trusting only the current root verifies the endorsement of a plugged-in change.
func (m *Material) endorsementChain() []string {
	out := append([]string{}, m.IntermediatePEMs()...)
	for _, c := range m.given {
		p := string(pki.EncodeCertPEM(c))
		if c.CheckSignatureFrom(c) == nil || c.Equal(m.Cert) || slices.Contains(out, p) {
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// RootPEMs is the trust bundle, newest first.
func (m *Material) RootPEMs() []string { return m.rootPEMs }

// RootFingerprint is the SHA-256 of the root the chain ends at.
func (m *Material) RootFingerprint() string { return m.rootFP }

// NotAfter is the earliest expiry along the chain: no leaf may outlive it.
func (m *Material) NotAfter() time.Time { return m.notAfter }

// RootNotAfter is the expiry of the root the chain ends at.
func (m *Material) RootNotAfter() time.Time { return m.Chain[len(m.Chain)-1].NotAfter }

// RootFingerprints lists the bundle's fingerprints.
func (m *Material) RootFingerprints() []string {
	out := make([]string, len(m.Roots))
	for i, r := range m.Roots {
		out[i] = pki.Fingerprint(r)
	}
	return out
}

// ErrCAExpired is returned when the CA cannot sign anything any more.
var ErrCAExpired = errors.New("CA certificate expired")

// Backdate is how far before issue a certificate's notBefore is set, so that a peer
// whose clock is a little behind does not see it as not yet valid (as SPIRE does).
const Backdate = 10 * time.Second

// SignLeaf issues a workload certificate for pub with id as its only SAN, valid from
// now (less Backdate) for ttl but never past the CA's own expiry. The subject is empty, as Istio's
// workload certificates, so the SAN extension is critical.
func (m *Material) SignLeaf(pub crypto.PublicKey, id *url.URL, now time.Time, ttl time.Duration) (*x509.Certificate, error) {
	return m.sign(&x509.Certificate{
		URIs:        []*url.URL{id},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, pub, now, ttl)
}

// SignServing issues a TLS server certificate for the signer's own gRPC endpoint.
func (m *Material) SignServing(pub crypto.PublicKey, dnsNames []string, ips []net.IP, now time.Time, ttl time.Duration) (*x509.Certificate, error) {
	return m.sign(&x509.Certificate{
		DNSNames:    dnsNames,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, pub, now, ttl)
}

func (m *Material) sign(tmpl *x509.Certificate, pub crypto.PublicKey, now time.Time, ttl time.Duration) (*x509.Certificate, error) {
	notAfter := now.Add(ttl)
	if ca := m.NotAfter(); notAfter.After(ca) {
		notAfter = ca
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("%w at %s", ErrCAExpired, m.NotAfter().Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-Backdate)
	tmpl.NotAfter = notAfter
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, m.Cert, pub, m.Key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	return x509.ParseCertificate(der)
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // never zero
}

// Authority holds the current material and tells subscribers when it changes.
type Authority struct {
	cur  atomic.Pointer[Material]
	mu   sync.Mutex
	subs []func(old, cur *Material)
}

// Current is the material to sign with now, or nil before the first load.
func (a *Authority) Current() *Material { return a.cur.Load() }

// Ready reports whether material is loaded.
func (a *Authority) Ready() error {
	if a.cur.Load() == nil {
		return errors.New("no CA material loaded")
	}
	return nil
}

// OnChange registers f to run (synchronously) after every change.
func (a *Authority) OnChange(f func(old, cur *Material)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.subs = append(a.subs, f)
}

// install makes m current when it is newer than the current material (or when force
// is set) and reports whether it did.
func (a *Authority) install(m *Material, force bool) bool {
	a.mu.Lock()
	old := a.cur.Load()
	if old != nil && !force && m.Generation <= old.Generation {
		a.mu.Unlock()
		return false
	}
	a.cur.Store(m)
	subs := append([]func(old, cur *Material){}, a.subs...)
	a.mu.Unlock()
	for _, f := range subs {
		f(old, m)
	}
	return true
}

// diff names the roots added and removed between two bundles, by fingerprint.
func diff(old, cur *Material) (added, removed []string) {
	had := map[string]bool{}
	if old != nil {
		for _, fp := range old.RootFingerprints() {
			had[fp] = true
		}
	}
	has := map[string]bool{}
	for _, fp := range cur.RootFingerprints() {
		has[fp] = true
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

// NewExternal is the material of an external signer (a registration authority's,
// kubecsr): above is what follows its leaves, intermediates then the root, as
// the leaf's verification built it. It holds no key: it signs nothing and
// endorses nothing; it is the Signing material of a reply, whose chain and root
// follow the leaf, while the mesh CA's material carries the trust bundle.
func NewExternal(above []*x509.Certificate) (*Material, error) {
	if len(above) == 0 {
		return nil, fmt.Errorf("%w: an external chain needs at least its root", ErrInvalidMaterial)
	}
	m := &Material{Cert: above[0], Chain: above, Roots: above[len(above)-1:]}
	m.chainPEMs = pki.CertPEMs(m.Chain)
	m.rootPEMs = pki.CertPEMs(m.Roots)
	m.rootFP = pki.Fingerprint(m.Roots[0])
	m.notAfter = above[0].NotAfter
	for _, c := range above {
		if c.NotAfter.Before(m.notAfter) {
			m.notAfter = c.NotAfter
		}
	}
	return m, nil
}

// AddRoots puts extra into the trust bundle after the material's own roots
// (those not in it already), before it is endorsed and installed: the roots of an
// external signer (-external-ca-cert-file) that the pods must trust, vouched for by
// the mesh CA's endorsement of the bundle. The bundle's bounds still hold.
func (m *Material) AddRoots(extra []*x509.Certificate) error {
	roots := slices.Clip(m.Roots)
	for _, r := range extra {
		if !slices.ContainsFunc(roots, r.Equal) {
			roots = append(roots, r)
		}
	}
	if len(roots) > MaxRoots {
		return fmt.Errorf("%w: the trust bundle holds %d roots with the external signer's, at most %d", ErrInvalidMaterial, len(roots), MaxRoots)
	}
	pems := pki.CertPEMs(roots)
	if n := 2*pemBytes(m.chainPEMs) + pemBytes(pems); n > MaxMaterialBytes {
		return fmt.Errorf("%w: the trust bundle and chain take %d bytes with the external signer's roots, at most %d", ErrInvalidMaterial, n, MaxMaterialBytes)
	}
	m.Roots, m.rootPEMs = roots, pems
	return nil
}
