package renewal

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
)

// Reasons a cert.issued record is rejected (meshagent_rotator_cert_rejected_total).
const (
	reasonNoChain   = "no_chain"
	reasonBadChain  = "bad_chain"
	reasonMismatch  = "mismatch"
	reasonUntrusted = "untrusted"
)

// bundleTimeout bounds one trust bundle request.
const bundleTimeout = 5 * time.Second

// verifyRecord checks a cert.issued record against its own chain and the trust
// bundle: the leaf's serial, SPIFFE ID and validity are the record's, the pod is
// in the identity's namespace, the chain
// verifies (at the leaf's NotBefore) to a trusted root, and that root is the one
// the record names. A record naming a root the rotator does not know yet (it may
// come before its trust.changed) makes it ask for the bundle once. It returns the
// reason for a rejection, or an error that is not errRejected when the bus failed.
func (r *Replica) verifyRecord(ctx context.Context, ev events.CertIssued) (string, error) {
	if len(ev.CertChain) == 0 {
		return reasonNoChain, errors.New("record has no cert_chain")
	}
	chain, err := pki.ParseCertPEMs(ev.CertChain)
	if err != nil {
		return reasonBadChain, fmt.Errorf("cert_chain: %w", err)
	}
	if err := matches(chain[0], ev); err != nil {
		return reasonMismatch, err
	}
	roots, err := r.trust.VerifyChainRoots(chain, nil, chain[0].NotBefore)
	if err != nil || !r.trust.Has(ev.RootFingerprint) {
		if err := r.refreshBundle(ctx, "record under unknown root"); err != nil {
			return "", err
		}
		roots, err = r.trust.VerifyChainRoots(chain, nil, chain[0].NotBefore)
	}
	if err != nil {
		return reasonUntrusted, err
	}
	fps := make([]string, len(roots))
	for i, root := range roots {
		fps[i] = pki.Fingerprint(root)
	}
	if !slices.Contains(fps, ev.RootFingerprint) {
		return reasonMismatch, fmt.Errorf("record names root %.16s, the chain ends at %.16s", ev.RootFingerprint, fps[0])
	}
	return "", nil
}

// matches checks that leaf is the certificate the record describes.
func matches(leaf *x509.Certificate, ev events.CertIssued) error {
	serial, ok := new(big.Int).SetString(ev.Serial, 16)
	if !ok || serial.Cmp(leaf.SerialNumber) != 0 {
		return fmt.Errorf("record serial %q, leaf serial %s", ev.Serial, pki.SerialHex(leaf))
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != ev.SPIFFEID {
		return fmt.Errorf("record for %s, leaf for %v", ev.SPIFFEID, leaf.URIs)
	}
	if !leaf.NotBefore.Equal(ev.NotBefore) || !leaf.NotAfter.Equal(ev.NotAfter) {
		return fmt.Errorf("record valid %s to %s, leaf %s to %s", ev.NotBefore, ev.NotAfter, leaf.NotBefore, leaf.NotAfter)
	}
	// A pod is only ever in its identity's namespace (the signer records no other):
	// a record for a pod of another namespace would be another namespace's entry.
	if _, ns, _, err := pki.ParseWorkloadID(ev.SPIFFEID); err != nil || ns != ev.Pod.Namespace {
		return fmt.Errorf("record for pod %s, leaf of identity %s in another namespace", ev.Pod, ev.SPIFFEID)
	}
	return nil
}

// refreshBundle asks a signer for the trust bundle and applies it if it verifies
// (on first use, or under a trusted root). It asks at most once per
// Options.BundleRefresh; a bundle that does not verify is counted and changes
// nothing. The error is the request's: the bus or no signer.
func (r *Replica) refreshBundle(ctx context.Context, why string) error {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	if !r.lastRefresh.IsZero() && r.clk.Now().Sub(r.lastRefresh) < r.opts.BundleRefresh {
		return nil
	}
	fctx, cancel := context.WithTimeout(ctx, bundleTimeout)
	defer cancel()
	reply, err := trustbundle.Fetch(fctx, r.nc, "rotator/"+r.opts.Instance)
	if err != nil {
		return fmt.Errorf("refresh trust bundle: %w", err)
	}
	r.lastRefresh = r.clk.Now()
	u, changed, err := r.trust.Accept(trustbundle.FromBundleReply(reply))
	if err != nil {
		r.m.events.WithLabelValues("trust.bundle", "rejected").Inc()
		r.log.Warn("trust bundle rejected", "why", why, "error", err)
		return nil
	}
	r.bootstrapped(u)
	if changed {
		r.keepBundle(ctx)
	}
	r.log.Debug("trust bundle refreshed", "why", why, "generation", reply.Generation, "changed", changed)
	return nil
}

// restoreBundle trusts the bundle a leader kept in the schedule bucket (written
// only by the rotator role, and only after it was checked), before asking for
// one: a replica taking over checks the signers' bundle against it, rather than
// trust the first bundle it hears. Without one (the fleet's first leader) the
// first bundle is still taken from the anchors, or on first use.
func (r *Replica) restoreBundle(ctx context.Context) {
	if r.trust.Bootstrapped() {
		return
	}
	b, ok, err := r.store.GetBundle(ctx)
	if err != nil || !ok {
		if err != nil {
			r.log.Warn("cannot read the kept trust bundle", "error", err)
		}
		return
	}
	roots, err := pki.ParseCertPEMs(b.Roots)
	if err != nil {
		r.log.Warn("kept trust bundle unreadable", "error", err)
		return
	}
	if r.trust.Restore(roots, b.Generation) {
		r.bootOnce.Do(func() {
			r.m.trustBootstrap.WithLabelValues("kept").Set(1)
			r.log.Info("trusting the bundle kept by the previous leader", "generation", b.Generation, "roots", len(roots))
		})
	}
}

// keepBundle writes the trusted roots for the next leader; a failure is logged,
// and the next change writes again.
func (r *Replica) keepBundle(ctx context.Context) {
	b := store.Bundle{Generation: r.trust.Generation(), Roots: pki.CertPEMs(r.trust.Roots())}
	if err := r.store.PutBundle(ctx, b); err != nil {
		r.log.Warn("cannot keep the trust bundle", "error", err)
	}
}

// bootstrapped logs, once, how the first bundle came to be trusted.
func (r *Replica) bootstrapped(u trustbundle.Update) {
	if !r.trust.Bootstrapped() {
		return
	}
	r.bootOnce.Do(func() {
		mode := r.trust.Mode()
		r.m.trustBootstrap.WithLabelValues(string(mode)).Set(1)
		if mode == trustbundle.FirstUse {
			r.log.Warn("trusting the first trust bundle on first use: no trust anchors configured", "generation", u.Generation, "roots", len(u.Roots))
		}
	})
}

// checkTrustChanged decides whether a trust.changed may reach the schedule: a
// newer bundle must be endorsed under a trusted root (and is then trusted), an
// older one (the stream's history, or a bundle already learned by a request)
// must still verify under the roots trusted now. Before the first bundle the
// rotator asks for one rather than trust an event on first use.
func (r *Replica) checkTrustChanged(ctx context.Context, ev events.TrustChanged) error {
	if !r.trust.Bootstrapped() {
		if err := r.refreshBundle(ctx, "trust.changed before the first bundle"); err != nil {
			return err
		}
		if !r.trust.Bootstrapped() {
			return fmt.Errorf("%w: no trusted bundle to check trust.changed against", errRejected)
		}
	}
	b := trustbundle.FromTrustChanged(ev)
	u, err := r.trust.Check(b)
	if err == nil && u.Stale {
		err = r.trust.Endorsed(b)
	}
	if err != nil {
		return fmt.Errorf("%w: trust.changed: %w", errRejected, err)
	}
	if r.trust.Apply(u) {
		r.keepBundle(ctx)
	}
	return nil
}
