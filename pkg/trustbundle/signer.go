package trustbundle

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// A named signer (Istio's CERT_SIGNERS) is a CA of its own: the chain it signs
// ends at its root, which a pod's trust bundle does not hold. The mesh CA vouches
// for that root to a pod that asked for the signer by endorsing it
// (events.SignerRoots, over events.SignerEndorsedBytes), as it vouches for a
// bundle or for a foreign domain's roots, so that no responder without a mesh
// CA key can have a pod accept a chain to a root of its choosing.

// EndorseSigner signs named signer's roots for trustDomain with each key.
func EndorseSigner(trustDomain, signer string, roots []string, keys ...crypto.Signer) ([]events.Endorsement, error) {
	msg, err := events.SignerEndorsedBytes(trustDomain, signer, roots)
	if err != nil {
		return nil, err
	}
	return endorseBytes(msg, keys)
}

// VerifySigner returns s's roots when s is a valid SignerRoots of trustDomain
// and one of its endorsements verifies under trusted (the pod's roots now).
func VerifySigner(trusted []*x509.Certificate, trustDomain string, s events.SignerRoots) ([]*x509.Certificate, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("%w: signer roots: %w", ErrRejected, err)
	}
	roots, err := pki.ParseCertPEMs(s.Roots)
	if err != nil {
		return nil, fmt.Errorf("%w: signer roots: %w", ErrRejected, err)
	}
	msg, err := events.SignerEndorsedBytes(trustDomain, s.Name, s.Roots)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	var errs []error
	for i, e := range s.Endorsements {
		chain, err := pki.ParseCertPEMs(e.Chain)
		if err == nil {
			if err = pki.VerifyEndorsement(trusted, msg, e.KeyID, e.Signature, chain); err == nil {
				return roots, nil
			}
		}
		errs = append(errs, fmt.Errorf("endorsement %d: %w", i, err))
	}
	return nil, fmt.Errorf("%w: signer %q's roots: no endorsement verifies under the trusted roots: %w", ErrRejected, s.Name, errors.Join(errs...))
}
