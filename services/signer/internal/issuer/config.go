package issuer

import (
	"context"
	"crypto/x509"
	"net/url"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/kubecsr"
	"github.com/nats-io/nats.go"
)

// Config holds the issuing policy.
type Config struct {
	TrustDomain string
	Instance    string
	DefaultTTL  time.Duration
	MaxTTL      time.Duration
	// PodMaxTTL caps the lifetime of a certificate for a pod (one recorded for a
	// pod, or asked with a pod-bound token): a longer request is clamped to it,
	// counted (Metrics.Clamped) and logged. 0: no cap below MaxTTL.
	PodMaxTTL time.Duration
	Signers   []string // accepted CertSigner names besides ""
	// Named holds the material of the named signers; nil: a CertSigner is only
	// checked against Signers and signed by the mesh CA.
	Named *ca.NamedSigners
	// Nodes authorizes impersonation by trusted node agents; nil: nobody may.
	Nodes NodeAuthorizer
	// Records keeps which pod each certificate was issued to (issued.Store), what
	// the bus auth callout admits a pod's certificate by; nil: none kept.
	Records Recorder
	// MaxEarlyPerMinute is the most early certificates (the one before less than a
	// quarter through its life) one pod, or SPIFFE ID without a pod, is issued per
	// ReissueWindow by this replica; more are refused with a reason (a pod that keeps
	// asking refuses what it gets); 0: no limit.
	MaxEarlyPerMinute int
	// Lives is told, before the mesh CA signs a leaf, how long it will live
	// (ca.SelfSigned: a rotation's phases last as long as the longest leaf issued);
	// nil: nobody.
	Lives LifeRecorder
	// External, when set, signs every leaf instead of the mesh CA: the signer is a
	// registration authority (kubecsr.RA, EXTERNAL_CA=ISTIOD_RA_KUBERNETES_API). The
	// mesh CA's material still carries the trust bundle, which holds the external
	// signer's roots.
	External ExternalSigner
}

// ExternalSigner has an external signer certify csr's key for id, for ttl, and
// returns the leaf and the material of the chain above it.
type ExternalSigner interface {
	Sign(ctx context.Context, csr *x509.CertificateRequest, id *url.URL, ttl time.Duration) (*x509.Certificate, *ca.Material, error)
}

var _ ExternalSigner = (*kubecsr.RA)(nil)

// LifeRecorder records the lifetime of a leaf about to be signed; an error refuses it.
type LifeRecorder interface {
	NoteLife(ctx context.Context, life time.Duration) error
}

var _ LifeRecorder = (*ca.SelfSigned)(nil)

// Recorder makes the write recording that leaf was issued to pod (issued.Store),
// which the issuer stores durably beside cert.issued.
type Recorder interface {
	Msg(leaf *x509.Certificate, pod events.PodRef, podUID string, now time.Time) (*nats.Msg, error)
}

// NodeAuthorizer decides whether an authenticated caller may have target's identity
// (authn.NodeAuthorizer: a trusted node agent, for a workload on its node).
type NodeAuthorizer interface {
	Authorize(ctx context.Context, caller authn.Caller, target string) (authn.Caller, error)
}

var _ NodeAuthorizer = (*authn.NodeAuthorizer)(nil)

// Publisher records an event durably (bus.Publish in production).
type Publisher func(ctx context.Context, msg *nats.Msg) error

// TokenVerifier checks a bearer token (authn.JWTVerifier offline, authn.TokenReviewer
// by the API server); every request's token is checked.
type TokenVerifier interface {
	Verify(token string) (authn.Caller, error)
}

var (
	_ TokenVerifier = (*authn.JWTVerifier)(nil)
	_ TokenVerifier = (*authn.TokenReviewer)(nil)
)
