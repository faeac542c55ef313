package trustbundle

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Foreign keeps the roots of foreign trust domains, each domain's apart, as
// heard in trust.federated events. An event is taken only when one of its
// endorsements verifies under the home set's roots: the home CA vouches that
// it followed that domain's bundle, so the bus alone cannot add a domain.
type Foreign struct {
	home *Set

	mu      sync.Mutex
	domains map[string]ForeignDomain
}

// ForeignDomain is one followed trust domain as last heard.
type ForeignDomain struct {
	TrustDomain string
	Roots       []*x509.Certificate
	Version     uint64
	Source      string
	Sequence    uint64
	RefreshHint time.Duration
	FetchedAt   time.Time
}

// NewForeign returns an empty foreign set checked against home.
func NewForeign(home *Set) *Foreign {
	return &Foreign{home: home, domains: map[string]ForeignDomain{}}
}

// Apply takes ev when its endorsement verifies under the home roots and its
// version is newer than the one held; it reports whether anything changed.
// A refused event changes nothing.
func (f *Foreign) Apply(ev events.TrustFederated) (bool, error) {
	if err := ev.Validate(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	if f.home.td != "" && ev.TrustDomain != f.home.td {
		return false, fmt.Errorf("%w: endorsed for %q, we are %q", ErrTrustDomain, ev.TrustDomain, f.home.td)
	}
	roots, err := pki.ParseCertPEMs(ev.Roots)
	if err != nil {
		return false, fmt.Errorf("%w: roots: %w", ErrRejected, err)
	}
	if err := verifyFederated(f.home.Roots(), ev); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	old, had := f.domains[ev.Foreign]
	if had && ev.Version <= old.Version {
		return false, nil
	}
	if ev.Removed {
		delete(f.domains, ev.Foreign)
		return had, nil
	}
	f.domains[ev.Foreign] = ForeignDomain{TrustDomain: ev.Foreign, Roots: roots, Version: ev.Version, Source: ev.Source,
		Sequence: ev.Sequence, RefreshHint: ev.RefreshHint, FetchedAt: ev.FetchedAt}
	return true, nil
}

// Roots returns the roots of foreign trust domain td, nil when not followed.
func (f *Foreign) Roots(td string) []*x509.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.domains[td].Roots)
}

// Domains lists the foreign domains held, sorted by name.
func (f *Foreign) Domains() []ForeignDomain {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]ForeignDomain, 0, len(f.domains))
	for _, d := range f.domains {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TrustDomain < out[j].TrustDomain })
	return out
}

// EndorseFederated signs a trust.federated event's content with each key.
func EndorseFederated(home, foreign string, version uint64, roots []string, keys ...crypto.Signer) ([]events.Endorsement, error) {
	msg, err := events.FederatedEndorsedBytes(home, foreign, version, roots)
	if err != nil {
		return nil, err
	}
	return endorseBytes(msg, keys)
}

func verifyFederated(trusted []*x509.Certificate, ev events.TrustFederated) error {
	if len(ev.Endorsements) == 0 {
		return fmt.Errorf("%w: not endorsed", ErrRejected)
	}
	msg, err := events.FederatedEndorsedBytes(ev.TrustDomain, ev.Foreign, ev.Version, ev.Roots)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRejected, err)
	}
	var errs []error
	for i, e := range ev.Endorsements {
		chain, err := pki.ParseCertPEMs(e.Chain)
		if err == nil {
			if err = pki.VerifyEndorsement(trusted, msg, e.KeyID, e.Signature, chain); err == nil {
				return nil
			}
		}
		errs = append(errs, fmt.Errorf("endorsement %d: %w", i, err))
	}
	return fmt.Errorf("%w: no endorsement verifies under the home roots: %w", ErrRejected, errors.Join(errs...))
}
