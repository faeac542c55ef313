package identity

// The checks the CA flow makes on the CA's reply before it believes any of it.

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/caclient"
)

// checked is a signing reply checkReply found acceptable: the parsed chain, the
// bundle update to apply with it, the roots it certifies and, for a named
// signer's chain, that signer's roots as the mesh CA endorsed them.
type checked struct {
	chain     []*x509.Certificate
	update    trustbundle.Update
	certified []*x509.Certificate
	signer    []*x509.Certificate
}

// checkReply decides whether a signing reply may be installed for key.
// The chain must be leaf first, each certificate signed by the next (see
// checkChain), and the leaf must carry key and exactly the pod's SPIFFE ID (so that
// no responder can hand the pod another identity). An endorsed bundle in the reply
// (or, before any, the first one, see trustbundle.Set.Check) may add roots, and
// remove the ones a whole bundle leaves out; then the leaf must verify to a root
// trusted now or just endorsed. See replyBundle for the bundle of a reply over
// gRPC, endorsed in a header or not at all.
//
// A named signer's chain (-cert-signer) ends at that signer's root, which the
// pod's bundle does not hold: it is accepted when the reply carries the signer's
// roots endorsed by a mesh root the pod trusts (or the bundle of the same reply
// just endorsed), for the signer the pod asked for; see checkSigner.
func (m *Manager) checkReply(resp caclient.Response, key crypto.Signer) (checked, error) {
	chain, err := checkChain(resp.ChainPEM, m.cfg.SPIFFEID)
	if err != nil {
		return checked{}, err
	}
	if !publicKeysEqual(chain[0].PublicKey, key.Public()) {
		return checked{}, errors.New("signed certificate is not for our key")
	}
	u, endorsed, err := m.replyBundle(resp)
	if err != nil {
		m.obs.TrustRejected(SourceSignReply)
		return checked{}, fmt.Errorf("sign reply: %w", err)
	}
	var extra []*x509.Certificate
	if !u.Stale {
		extra = u.Roots
	}
	signer, err := m.checkSigner(resp, extra)
	if err != nil {
		m.obs.TrustRejected(SourceSignReply)
		return checked{}, fmt.Errorf("sign reply: %w", err)
	}
	extra = append(slices.Clip(extra), signer...)
	// A CA clock a little ahead of ours must not fail a fresh leaf.
	at := m.clock.Now()
	if nb := chain[0].NotBefore; at.Before(nb) {
		at = nb
	}
	if err := m.trust.ca.VerifyChain(chain, extra, at); err != nil {
		m.obs.TrustRejected(SourceSignReply)
		return checked{}, fmt.Errorf("signed certificate: %w", err)
	}
	var certified []*x509.Certificate
	if !endorsed {
		var cerr error
		if certified, cerr = m.trust.ca.Certified(chain, extra, at); cerr != nil {
			// The leaf verifies to a trusted root: keep it, but not the stranger.
			m.log.Warn("sign reply ends at a root not certified under a trusted one; not trusting it", "root", pki.Fingerprint(chain[len(chain)-1]), "error", cerr)
		}
	}
	return checked{chain: chain, update: u, certified: certified, signer: signer}, nil
}

// replyBundle checks the trust bundle of a signing reply and returns the update to
// apply with it, and whether it was endorsed. On the bus the reply's bundle is
// endorsed, and checked as trust.changed is (trustbundle.Set.Check).
//
// Over gRPC, a meshagent signer sends its whole bundle endorsed in a response
// header (resp.Vouched): checked the same way, it replaces the pod's roots, so a
// retired root leaves as it does on the bus. One that does not verify under what
// the pod trusts is counted and ignored, and the reply is taken as Istio's: a
// responder could as well have left the header out.
//
// Istio's reply vouches for nothing: it is trusted first only as far as the
// configured anchors go (all of them: -ca-root-cert or -trust-anchors-file is a
// bundle), or on first use without any; after that it adds only a root whose key
// a trusted root has certified in the chain (the cross-signed certificate of a
// rotation; see checkReply), and its leaf must verify to the roots trusted already.
func (m *Manager) replyBundle(resp caclient.Response) (trustbundle.Update, bool, error) {
	if resp.Vouched != nil {
		b := *resp.Vouched
		if b.TrustDomain == "" {
			b.TrustDomain = m.cfg.TrustDomain
		}
		u, err := m.trust.ca.Check(b)
		if err == nil {
			return u, true, nil
		}
		m.obs.TrustRejected(SourceSignReply)
		m.log.Warn("ignoring the trust bundle in the CA's reply header: it does not verify under the roots this pod trusts",
			"generation", b.Generation, "error", err)
	}
	if resp.Signer != nil && !resp.Endorsed && !m.trust.ca.Bootstrapped() && len(m.cfg.Anchors) == 0 {
		// Istio's reply names no mesh root but the chain's last, the signer's own.
		return trustbundle.Update{}, false, fmt.Errorf("signer %q's chain over the gRPC CA before any trust bundle: configure the mesh's roots (-ca-root-cert or -trust-anchors-file)", resp.Signer.Name)
	}
	b := resp.Bundle
	if b.TrustDomain == "" {
		b.TrustDomain = m.cfg.TrustDomain
	}
	if !resp.Endorsed && !m.trust.ca.Bootstrapped() && len(m.cfg.Anchors) > 0 {
		// Istio's reply vouches for nothing: begin with every configured anchor.
		b.Roots = pki.CertPEMs(m.cfg.Anchors)
	}
	if resp.Endorsed || !m.trust.ca.Bootstrapped() {
		u, err := m.trust.ca.Check(b)
		return u, resp.Endorsed, err
	}
	return trustbundle.Update{Stale: true}, false, nil
}

// checkSigner returns the named signer's roots a reply carries when the mesh CA
// endorsed them (under a root trusted now, or one of extra: the reply's own bundle
// update) for the signer this pod asks for; none when the reply carries none.
func (m *Manager) checkSigner(resp caclient.Response, extra []*x509.Certificate) ([]*x509.Certificate, error) {
	if resp.Signer == nil {
		return nil, nil
	}
	if m.cfg.CertSigner == "" || resp.Signer.Name != m.cfg.CertSigner {
		return nil, fmt.Errorf("the reply vouches for signer %q's roots, we asked for signer %q", resp.Signer.Name, m.cfg.CertSigner)
	}
	trusted := append(m.trust.ca.Roots(), extra...)
	if !m.trust.ca.Bootstrapped() {
		trusted = append(trusted, m.cfg.Anchors...)
	}
	return trustbundle.VerifySigner(trusted, m.cfg.TrustDomain, *resp.Signer)
}

func fingerprints(certs []*x509.Certificate) []string {
	out := make([]string, len(certs))
	for i, c := range certs {
		out[i] = pki.Fingerprint(c)
	}
	return out
}

// checkChain parses and checks a reply chain: at least leaf and root, the leaf
// signed by the next, each CA certificate after it signed by the next or certifying
// the same key as the next, and a leaf for exactly id. Whether the root is one the
// pod trusts is checkReply's next step.
//
// The same-key case is phase 2 of a rotation to a new key: [leaf, cross, new root],
// where the cross-signed certificate carries the new key under the old root and the
// new root is that key's own certificate (the reply's last PEM, which Istio agents
// trust). Both are the one CA; the leaf verifies through either.
func checkChain(pems []string, id string) ([]*x509.Certificate, error) {
	if len(pems) < 2 {
		return nil, fmt.Errorf("chain has %d certificate(s): want leaf and root at least", len(pems))
	}
	chain, err := pki.ParseCertPEMs(pems)
	if err != nil {
		return nil, fmt.Errorf("parse chain: %w", err)
	}
	for i := 0; i+1 < len(chain); i++ {
		err := chain[i].CheckSignatureFrom(chain[i+1])
		if err != nil && i > 0 && chain[i].IsCA && publicKeysEqual(chain[i].PublicKey, chain[i+1].PublicKey) {
			continue // a cross-signed certificate, then its key's own root
		}
		if err != nil {
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
