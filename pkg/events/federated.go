package events

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// TypeTrustFederated: a signer followed a foreign trust domain's bundle.
const TypeTrustFederated = "io.meshagent.trust.federated.v1"

// TrustFederatedWildcard matches the trust.federated subjects of every foreign
// domain: one subject per domain, so the stream's last message per subject is
// the current news of each (meshctl trust reads them so).
const TrustFederatedWildcard = Prefix + ".evt.trust.federated.>"

// TrustFederatedSubject is the subject of foreign trust domain td's news ('.'
// becomes '~', as in pod subjects).
func TrustFederatedSubject(td string) (string, error) {
	if td == "" || !allIn(td, ".-_") {
		return "", fmt.Errorf("invalid trust domain %q for a subject", td)
	}
	return Prefix + ".evt.trust.federated." + strings.ReplaceAll(td, ".", "~"), nil
}

// TrustFederatedLastWildcard matches the JetStream direct-get subjects that
// answer the last trust.federated of a domain kept in the CA's history
// (StreamEvents): a pod may ask them (pkg/bus/policy), and nothing else of the
// stream, so that a pod started after an announcement holds the foreign roots at
// once (checked like any other announcement).
const TrustFederatedLastWildcard = "$JS.API.DIRECT.GET." + StreamEvents + "." + TrustFederatedWildcard

// TrustFederatedLastSubject is the direct-get subject of td's last trust.federated.
func TrustFederatedLastSubject(td string) (string, error) {
	s, err := TrustFederatedSubject(td)
	if err != nil {
		return "", err
	}
	return "$JS.API.DIRECT.GET." + StreamEvents + "." + s, nil
}

func init() { register[TrustFederated]() }

// TrustFederated is published by a signer when the bundle of a foreign trust
// domain it follows changes (Roots set) or stops being followed (Removed).
// Pods never fetch foreign bundles themselves: they take this event only when
// one of its endorsements verifies under their own trust domain's roots, over
// FederatedEndorsedBytes — the home CA vouches that it followed this bundle.
type TrustFederated struct {
	TrustDomain string   `json:"trust_domain"` // the home trust domain, whose CA endorses
	Foreign     string   `json:"foreign"`      // the followed trust domain
	Roots       []string `json:"roots,omitempty"`
	Removed     bool     `json:"removed,omitempty"`
	// Version orders news about one foreign domain (the fetch time in Unix
	// nanoseconds): a consumer drops a version lower than the one it has.
	Version     uint64        `json:"version"`
	Source      string        `json:"source,omitempty"`   // bundle endpoint URL or file:path
	Sequence    uint64        `json:"sequence,omitempty"` // the bundle's spiffe_sequence
	RefreshHint time.Duration `json:"refresh_hint,omitempty"`
	FetchedAt   time.Time     `json:"fetched_at,omitempty"`
	// Endorsements sign FederatedEndorsedBytes with the home CA's key.
	Endorsements []Endorsement `json:"endorsements,omitempty"`
}

func (TrustFederated) EventType() string { return TypeTrustFederated }
func (e TrustFederated) Validate() error {
	var f fields
	f.nonEmpty(e.TrustDomain, "trust_domain")
	f.nonEmpty(e.Foreign, "foreign")
	if !e.Removed {
		f.pems(e.Roots, "roots", 1)
	}
	err := f.err()
	if e.Foreign != "" && e.Foreign == e.TrustDomain {
		err = errors.Join(err, errors.New("foreign: is the home trust domain"))
	}
	return err
}

// FederatedEndorsedBytes is what a TrustFederated endorsement signs: the home
// and foreign trust domains, the version and each root's SHA-256 (none when
// removed), so that an endorsement of one domain's bundle cannot be replayed
// as another's, nor as the home bundle (EndorsedBytes).
func FederatedEndorsedBytes(home, foreign string, version uint64, roots []string) ([]byte, error) {
	if strings.ContainsAny(home+foreign, "\n/") || foreign == "" {
		return nil, errors.New("endorse: bad trust domain")
	}
	return EndorsedBytes(home+"/federated/"+foreign, version, roots)
}
