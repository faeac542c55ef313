package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// SignRequest asks a signer for a certificate. The identity is taken from the
// credential, never from the CSR: either Token (a JWT) or CertChain plus Proof, a
// still-valid meshagent certificate and a signature with its key over the SHA-256 of
// the CSR's DER bytes (base64, ASN.1 for ECDSA, PKCS#1 v1.5 for RSA).
type SignRequest struct {
	CSR       string   `json:"csr"`
	Token     string   `json:"token,omitempty"`
	CertChain []string `json:"cert_chain,omitempty"`
	Proof     string   `json:"proof,omitempty"`
	// TTL is the requested lifetime; 0 asks for the signer's default. It stays a
	// Duration everywhere in Go and travels as whole seconds, ttl_seconds (see
	// MarshalJSON): a sub-second remainder is dropped, and a negative value or one
	// too large for a Duration is refused when decoded, never wrapped.
	TTL      time.Duration `json:"ttl_seconds,omitempty"`
	Pod      PodRef        `json:"pod,omitzero" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Resource string        `json:"resource,omitempty" jsonschema:"maxLength=253,pattern=^[A-Za-z0-9._:~/-]+$"`
	// KeyAlgorithm names the CSR key's algorithm for the cert.issued event; the signer
	// checks it against the CSR.
	KeyAlgorithm string `json:"key_algorithm,omitempty"`
	// CertSigner names the signer the caller wants (Istio's CertSigner metadata);
	// empty means the signer's default. A signer rejects names it does not serve.
	CertSigner string `json:"cert_signer,omitempty"`
	// Deadline is when the requester stops waiting for the reply (zero: not said).
	// A signer that reads the request after it drops it unsigned: a certificate
	// issued then would reach nobody. It travels in milliseconds since the epoch
	// (compact field 10; RFC 3339 in JSON), so signers and pods need clocks that
	// agree to well within a request's timeout, as certificates' NotBefore already
	// asks.
	Deadline time.Time `json:"deadline,omitzero"`
}

// Expired reports whether the requester said it stops waiting before now.
func (e SignRequest) Expired(now time.Time) bool {
	return !e.Deadline.IsZero() && !now.Before(e.Deadline)
}

func (SignRequest) EventType() string { return TypeSignRequest }
func (e SignRequest) Validate() error {
	var f fields
	f.need(strings.Contains(e.CSR, "-----BEGIN CERTIFICATE REQUEST-----"), "csr", "not a PEM certificate request")
	f.need(e.Token != "" || len(e.CertChain) > 0, "token", "a token or a cert_chain is required")
	f.need(len(e.CertChain) == 0 || e.Proof != "", "proof", "required with cert_chain")
	f.need(e.TTL >= 0, "ttl_seconds", "must not be negative")
	f.need(e.TTL == 0 || e.TTL >= time.Second, "ttl_seconds", "a TTL under a second cannot be sent: the wire counts whole seconds")
	f.pod(e.Pod, "pod", false)
	f.resource(e.Resource, "resource")
	return f.err()
}

// signRequestJSON is SignRequest with its own JSON methods left out, so that the
// methods below can use the standard encoding: the same fields, in the same order.
type signRequestJSON SignRequest

// MarshalJSON writes TTL as ttl_seconds, in whole seconds.
func (e SignRequest) MarshalJSON() ([]byte, error) {
	w := signRequestJSON(e)
	w.TTL = e.TTL / time.Second // the field carries the count of seconds on the wire
	return json.Marshal(w)
}

// UnmarshalJSON reads ttl_seconds into TTL. A negative count, or one that does not
// fit in a Duration, is refused: multiplying it would wrap.
func (e *SignRequest) UnmarshalJSON(b []byte) error {
	var w signRequestJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	ttl, err := TTLFromSeconds(int64(w.TTL))
	if err != nil {
		return fmt.Errorf("ttl_seconds: %w", err)
	}
	w.TTL = ttl
	*e = SignRequest(w)
	return nil
}

// MaxTTLSeconds is the largest TTL, in seconds, that a time.Duration holds (about
// 292 years).
const MaxTTLSeconds = int64(math.MaxInt64 / time.Second)

// TTLFromSeconds turns a count of seconds from the wire (ttl_seconds, Istio's
// ValidityDuration) into a Duration. A negative count or one over MaxTTLSeconds is
// an error rather than a wrapped value.
func TTLFromSeconds(s int64) (time.Duration, error) {
	switch {
	case s < 0:
		return 0, fmt.Errorf("%d seconds is negative", s)
	case s > MaxTTLSeconds:
		return 0, fmt.Errorf("%d seconds is more than a TTL can be (%d)", s, MaxTTLSeconds)
	}
	return time.Duration(s) * time.Second, nil
}

// Reply error codes, named after the gRPC codes they map to.
const (
	CodeInvalidArgument   = "invalid_argument"
	CodeUnauthenticated   = "unauthenticated"
	CodePermissionDenied  = "permission_denied"
	CodeResourceExhausted = "resource_exhausted"
	CodeUnavailable       = "unavailable"
	CodeInternal          = "internal"
	// CodeDeadlineExceeded: the request's deadline passed before it was signed.
	CodeDeadlineExceeded = "deadline_exceeded"
)

// ReplyError is the error half of every reply.
type ReplyError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfterMillis, set on a refusal of a busy signer (CodeUnavailable), is when
	// to ask again: the slot the signer's waiting room gave the requester, so that a
	// crowd turned away together comes back spread at the pace the signer works.
	RetryAfterMillis uint64 `json:"retry_after_ms,omitempty"`
}

// MaxRetryAfter bounds ReplyError's retry-after on the wire.
const MaxRetryAfter = 10 * time.Minute

func (e *ReplyError) Error() string { return e.Code + ": " + e.Message }

// RetryAfter is when the signer asked its requester to come back (0: not said).
func (e *ReplyError) RetryAfter() time.Duration {
	return time.Duration(min(e.RetryAfterMillis, uint64(MaxRetryAfter/time.Millisecond))) * time.Millisecond
}

// RetryAfterOf is the retry-after of the ReplyError in err's chain (0: none).
func RetryAfterOf(err error) time.Duration {
	var re *ReplyError
	if errors.As(err, &re) {
		return re.RetryAfter()
	}
	return 0
}

// SignReply answers a SignRequest: the chain leaf first, root last (at least two
// PEMs, as Istio returns it) and the whole trust bundle, endorsed as in TrustChanged
// so that a pod can follow a root rotation it has not heard of yet; or an error.
type SignReply struct {
	CertChain    []string      `json:"cert_chain,omitempty"`
	Roots        []string      `json:"roots,omitempty"`
	TrustDomain  string        `json:"trust_domain,omitempty"`
	Generation   uint64        `json:"generation,omitempty"`
	Endorsements []Endorsement `json:"endorsements,omitempty"`
	// Signer is set when a named signer (CertSigner) signed the chain: its roots,
	// which the chain ends at, endorsed by the mesh CA.
	Signer *SignerRoots `json:"signer,omitempty"`
	Error  *ReplyError  `json:"error,omitempty"`
}

func (SignReply) EventType() string { return TypeSignReply }
func (e SignReply) Validate() error {
	var f fields
	if e.Error != nil {
		f.nonEmpty(e.Error.Code, "error.code")
		f.need(e.Error.RetryAfterMillis <= uint64(MaxRetryAfter/time.Millisecond), "error.retry_after_ms", "more than "+MaxRetryAfter.String())
		return f.err()
	}
	f.pems(e.CertChain, "cert_chain", 2)
	f.pems(e.Roots, "roots", 1)
	if e.Signer != nil {
		e.Signer.check(&f)
	}
	return f.err()
}

// SignerRoots are a named signer's roots (Istio's CERT_SIGNERS, each a CA of its
// own) as the mesh CA vouches for them to a pod that asked for that signer:
// Endorsements sign SignerEndorsedBytes with the mesh CA's key, as a bundle's do,
// so that the pod accepts a chain ending at one of Roots although its own trust
// bundle does not hold it.
type SignerRoots struct {
	Name         string        `json:"name"`
	Roots        []string      `json:"roots"`
	Endorsements []Endorsement `json:"endorsements"`
}

// Validate checks that s names a signer, holds roots and is endorsed.
func (s SignerRoots) Validate() error {
	var f fields
	s.check(&f)
	return f.err()
}

func (s SignerRoots) check(f *fields) {
	f.nonEmpty(s.Name, "signer.name")
	f.pems(s.Roots, "signer.roots", 1)
	f.need(len(s.Endorsements) > 0, "signer.endorsements", "required")
}

// SignerRootsHeader is the gRPC response header in which a signer answering
// Istio's CreateCertificate for a named signer sends the SignerRoots (as JSON):
// Istio's response has only the chain, and an Istio agent ignores the header.
const SignerRootsHeader = "meshagent-signer-roots-bin"

// TrustBundleHeader is the gRPC response header in which a signer answering
// Istio's CreateCertificate sends its whole current trust bundle, endorsed as a
// sign reply's on the bus is (a BundleReply as JSON: trust domain, roots,
// generation, endorsements): Istio's response has only the chain, whose last PEM
// vouches for nothing, so that a pod on the gRPC path follows a root's retirement
// as a bus pod does. An Istio agent ignores the header.
const TrustBundleHeader = "meshagent-trust-bundle-bin"

// SignerEndorsedBytes is what a SignerRoots endorsement signs: the mesh's trust
// domain, the signer's name and each root's SHA-256, so that it cannot be replayed
// as another signer's, as a foreign domain's (FederatedEndorsedBytes) or as the
// mesh's own bundle (EndorsedBytes).
func SignerEndorsedBytes(trustDomain, signer string, roots []string) ([]byte, error) {
	if strings.ContainsAny(trustDomain, "\n/") || strings.ContainsAny(signer, "\n/") || signer == "" {
		return nil, errors.New("endorse: bad trust domain or signer name")
	}
	return EndorsedBytes(trustDomain+"/signer/"+signer, 0, roots)
}
