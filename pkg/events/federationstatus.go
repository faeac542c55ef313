package events

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"time"
)

// FederationStatus is what one signer replica knows of the foreign trust
// domains it follows, whether their last refresh worked or not: a
// BundleReply carries it (as JSON, endorsed by the CA key) when the request
// asks for it. Each replica follows on its own; the status is the answering
// replica's.
type FederationStatus struct {
	Signer  string            `json:"signer"` // the replica that answered
	At      time.Time         `json:"at"`
	Domains []FederatedDomain `json:"domains"`
	// Truncated counts the domains left out to keep the reply bounded.
	Truncated int `json:"truncated,omitempty"`
}

// States of a followed domain.
const (
	FederationOK      = "ok"      // the last refresh fetched and announced the bundle
	FederationFailing = "failing" // the last refresh failed; the last good bundle is kept
	FederationNever   = "never"   // no refresh has worked yet: nothing is trusted for it
)

// FederatedDomain is the state of one followed foreign trust domain.
type FederatedDomain struct {
	TrustDomain string          `json:"trust_domain"`
	Source      string          `json:"source"` // bundle endpoint URL or file:path
	State       string          `json:"state"`  // FederationOK, FederationFailing, FederationNever
	Roots       int             `json:"roots"`
	RootInfo    []FederatedRoot `json:"root_info,omitempty"`
	Sequence    uint64          `json:"sequence,omitempty"`
	RefreshHint time.Duration   `json:"refresh_hint,omitempty"`
	LastSuccess time.Time       `json:"last_success,omitzero"`
	NextRefresh time.Time       `json:"next_refresh,omitzero"`
	// Error is the current failure ("" when the last refresh worked); LastError
	// the last failure, kept after a success.
	Error           string            `json:"error,omitempty"`
	ErrorReason     string            `json:"error_reason,omitempty"`
	LastError       string            `json:"last_error,omitempty"`
	LastErrorReason string            `json:"last_error_reason,omitempty"`
	LastErrorAt     time.Time         `json:"last_error_at,omitzero"`
	Errors          map[string]uint64 `json:"errors,omitempty"` // failed refreshes by reason
}

// FederatedRoot is one root held for a foreign domain.
type FederatedRoot struct {
	SHA256   string    `json:"sha256"`
	Subject  string    `json:"subject,omitempty"`
	NotAfter time.Time `json:"not_after"`
}

// federationStatusTag versions the bytes a FederationStatus endorsement covers.
const federationStatusTag = "meshagent-federation-status-v1"

// FederationStatusEndorsedBytes is what an endorsement of a BundleReply's
// Federation signs: the home trust domain and the SHA-256 of the status JSON
// exactly as carried.
func FederationStatusEndorsedBytes(home string, status []byte) ([]byte, error) {
	if home == "" || strings.ContainsAny(home, "\n") {
		return nil, errors.New("endorse: bad trust domain")
	}
	sum := sha256.Sum256(status)
	return []byte(federationStatusTag + "\n" + home + "\n" + hex.EncodeToString(sum[:]) + "\n"), nil
}
