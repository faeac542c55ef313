package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Type names. The version is part of the name; see the package comment.
const (
	TypeCertIssued      = "io.meshagent.cert.issued.v1"
	TypeTrustChanged    = "io.meshagent.trust.changed.v1"
	TypeSignRequest     = "io.meshagent.sign.request.v1"
	TypeSignReply       = "io.meshagent.sign.reply.v1"
	TypeBundleRequest   = "io.meshagent.trust.bundle_request.v1"
	TypeBundleReply     = "io.meshagent.trust.bundle_reply.v1"
	TypeRotateRequest   = "io.meshagent.root.rotate_request.v1"
	TypeRotateReply     = "io.meshagent.root.rotate_reply.v1"
	TypeRenewDue        = "io.meshagent.rotation.renew_due.v1"
	TypeSecretPushed    = "io.meshagent.sds.pushed.v1"
	TypeSDSNack         = "io.meshagent.sds.nack.v1"
	TypePodUp           = "io.meshagent.pod.up.v1"
	TypePodDown         = "io.meshagent.pod.down.v1"
	TypeXDSConnected    = "io.meshagent.xds.connected.v1"
	TypeXDSDisconnected = "io.meshagent.xds.disconnected.v1"
	TypeXDSNack         = "io.meshagent.xds.nack.v1"
	TypeXDSAcked        = "io.meshagent.xds.acked.v1"
	TypeTrustAnchors    = "io.meshagent.trust.anchors.v1"
	TypeEnvoyStarted    = "io.meshagent.envoy.started.v1"
	TypeEnvoyReady      = "io.meshagent.envoy.ready.v1"
	TypeEnvoyDraining   = "io.meshagent.envoy.draining.v1"
	TypeEnvoyExited     = "io.meshagent.envoy.exited.v1"
	TypeCertExpiring    = "io.meshagent.cert.expiring.v1"
	TypePodParts        = "io.meshagent.pod.parts.v1"
)

func init() {
	register[CertIssued]()
	register[TrustChanged]()
	register[SignRequest]()
	register[SignReply]()
	register[BundleRequest]()
	register[BundleReply]()
	register[RotateRequest]()
	register[RotateReply]()
	register[RenewDue]()
	register[SecretPushed]()
	register[SDSNack]()
	register[PodUp]()
	register[PodDown]()
	register[XDSConnected]()
	register[XDSDisconnected]()
	register[XDSNack]()
	register[XDSAcked]()
	register[TrustAnchors]()
	register[EnvoyStarted]()
	register[EnvoyReady]()
	register[EnvoyDraining]()
	register[EnvoyExited]()
	register[CertExpiring]()
	register[PodParts]()
}

// fields collects validation problems so that every one is reported at once.
type fields []error

func (f *fields) need(ok bool, name, what string) {
	if !ok {
		*f = append(*f, fmt.Errorf("%s: %s", name, what))
	}
}
func (f *fields) nonEmpty(v, name string) { f.need(v != "", name, "required") }
func (f *fields) err() error              { return errors.Join(*f...) }
func (f *fields) pems(v []string, name string, min int) {
	f.need(len(v) >= min, name, fmt.Sprintf("need at least %d PEM block(s)", min))
	for i, p := range v {
		f.need(strings.Contains(p, "-----BEGIN CERTIFICATE-----"), fmt.Sprintf("%s[%d]", name, i), "not a PEM certificate")
	}
}

// pod checks a pod field: "<namespace>/<name>", both valid (PodRef.Validate).
func (f *fields) pod(v PodRef, name string, required bool) {
	if v.IsZero() {
		f.need(!required, name, "required")
		return
	}
	if err := v.Validate(); err != nil {
		*f = append(*f, fmt.Errorf("%s: want <namespace>/<name>: %w", name, err))
	}
}

// resource bounds the name of a CA-issued SDS resource. The rotator keys its schedule
// on (pod, resource), so an unbounded name is a way to break it.
func (f *fields) resource(v, name string) {
	f.need(v == "" || len(v) <= 253 && allIn(v, "._:~/-"), name, "want 1-253 of [A-Za-z0-9._:~/-]")
}

// CertIssued is published by a signer for every certificate it issues. It carries
// public data only: never a key, never a token.
type CertIssued struct {
	Serial       string    `json:"serial"` // hex, as in the certificate
	SPIFFEID     string    `json:"spiffe_id"`
	NotBefore    time.Time `json:"not_before"`
	NotAfter     time.Time `json:"not_after"`
	Pod          PodRef    `json:"pod,omitzero" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`             // from a pod-bound token, else as the request named it; empty when neither does
	Resource     string    `json:"resource,omitempty" jsonschema:"maxLength=253,pattern=^[A-Za-z0-9._:~/-]+$"` // SDS resource the cert is for, "default" unless said
	KeyAlgorithm string    `json:"key_algorithm"`                                                              // of the leaf's public key: EC-P256, EC-P384, RSA-2048, ...
	AuthSource   string    `json:"auth_source"`                                                                // "jwt", "x509" or "bus" (an identity sign subject)
	Signer       string    `json:"signer"`                                                                     // signer instance id
	Transport    string    `json:"transport,omitempty"`
	// RootFingerprint is the SHA-256 (hex) of the root the chain ends at, so that
	// leaves under an old root can be found after a root rotation.
	RootFingerprint string `json:"root_fingerprint"`
	// CertChain is the issued chain, leaf first, without the root (public data), so a
	// consumer can check the record against the trust bundle instead of believing it.
	CertChain []string `json:"cert_chain,omitempty"`
	// CertSigner names the named signer (CERT_SIGNERS) whose own CA signed, empty for
	// the mesh CA: such a chain ends at that signer's root, not at a root of the
	// mesh's bundle, by design.
	CertSigner string `json:"cert_signer,omitempty" jsonschema:"maxLength=253,pattern=^[A-Za-z0-9._:~/-]+$"`
}

func (CertIssued) EventType() string { return TypeCertIssued }
func (e CertIssued) Validate() error {
	var f fields
	f.nonEmpty(e.Serial, "serial")
	f.need(strings.HasPrefix(e.SPIFFEID, "spiffe://"), "spiffe_id", "must be a spiffe:// URI")
	f.need(!e.NotBefore.IsZero(), "not_before", "required")
	f.need(e.NotAfter.After(e.NotBefore), "not_after", "must be after not_before")
	f.pod(e.Pod, "pod", false)
	f.resource(e.Resource, "resource")
	f.nonEmpty(e.KeyAlgorithm, "key_algorithm")
	f.nonEmpty(e.AuthSource, "auth_source")
	f.nonEmpty(e.Signer, "signer")
	f.nonEmpty(e.RootFingerprint, "root_fingerprint")
	f.resource(e.CertSigner, "cert_signer")
	return f.err()
}

// Reasons a trust bundle changes.
const (
	TrustReasonRotation = "root-rotation"
	TrustReasonReload   = "ca-reload"
	TrustReasonExpired  = "root-expired"
	TrustReasonRetired  = "root-retired"
)

// TrustChanged is published by a signer whenever the set of trusted roots changes.
// Roots is the whole bundle, newest first; Added and Removed name the change by
// SHA-256 fingerprint.
type TrustChanged struct {
	TrustDomain string   `json:"trust_domain"`
	Roots       []string `json:"roots"`
	Added       []string `json:"added,omitempty"`
	Removed     []string `json:"removed,omitempty"`
	Reason      string   `json:"reason"`
	// Generation increases with every change, so a consumer can drop stale news.
	Generation uint64 `json:"generation"`
	// Endorsements vouch for the bundle: see Endorsement.
	Endorsements []Endorsement `json:"endorsements,omitempty"`
}

func (TrustChanged) EventType() string { return TypeTrustChanged }
func (e TrustChanged) Validate() error {
	var f fields
	f.nonEmpty(e.TrustDomain, "trust_domain")
	f.pems(e.Roots, "roots", 1)
	f.nonEmpty(e.Reason, "reason")
	return f.err()
}

// BundleRequest asks for the current trust bundle; with Federation, also for
// the answering signer's FederationStatus.
type BundleRequest struct {
	Federation bool `json:"federation,omitempty"`
	// Rotation asks for the live plan of the root rotation under way (meshctl
	// status and rotate root); pods leave it out.
	Rotation bool `json:"rotation,omitempty"`
}

func (BundleRequest) EventType() string { return TypeBundleRequest }
func (BundleRequest) Validate() error   { return nil }

// BundleReply answers a BundleRequest.
type BundleReply struct {
	TrustDomain  string        `json:"trust_domain,omitempty"`
	Roots        []string      `json:"roots,omitempty"`
	Generation   uint64        `json:"generation,omitempty"`
	Endorsements []Endorsement `json:"endorsements,omitempty"`
	// Federation is the answering signer's FederationStatus as JSON (when the
	// request asked), endorsed by the CA key over FederationStatusEndorsedBytes.
	Federation             json.RawMessage `json:"federation,omitempty"`
	FederationEndorsements []Endorsement   `json:"federation_endorsements,omitempty"`
	// Rotation is the answering signer's live plan of the current rotation (when
	// the request asked and its CA rotates; Rotated is zero when none was made):
	// its phase now and when the next ones begin, from the certificates signed so far.
	Rotation *RotationPlan `json:"rotation,omitempty"`
	Error    *ReplyError   `json:"error,omitempty"`
}

func (BundleReply) EventType() string { return TypeBundleReply }
func (e BundleReply) Validate() error {
	var f fields
	if e.Error != nil {
		f.nonEmpty(e.Error.Code, "error.code")
		return f.err()
	}
	f.pems(e.Roots, "roots", 1)
	return f.err()
}

// RotateRequest forces a root rotation (meshctl rotate root).
type RotateRequest struct {
	NewKey bool   `json:"new_key,omitempty"`
	Reason string `json:"reason,omitempty"`
	// DryRun asks for the plan of the rotation (or its refusal) without rotating.
	DryRun bool `json:"dry_run,omitempty"`
}

func (RotateRequest) EventType() string { return TypeRotateRequest }
func (RotateRequest) Validate() error   { return nil }

// RotateReply answers a RotateRequest with the new root's fingerprint and bundle.
type RotateReply struct {
	Fingerprint string        `json:"fingerprint,omitempty"`
	Roots       []string      `json:"roots,omitempty"`
	Plan        *RotationPlan `json:"plan,omitempty"`
	Error       *ReplyError   `json:"error,omitempty"`
}

// RotationPlan is the schedule of a root rotation (docs/architecture.md, "Root
// rotation in phases"): Phase 1 from Rotated, the old root the reply's last PEM; 2
// from NewRootLast; 3 (settled) from Settled; the old root leaves the bundle at
// OldRootLeaves (zero: no old root in it).
type RotationPlan struct {
	Phase         int       `json:"phase"`
	Rotated       time.Time `json:"rotated,omitzero"`
	NewRootLast   time.Time `json:"new_root_last,omitzero"`
	Settled       time.Time `json:"settled,omitzero"`
	OldRootLeaves time.Time `json:"old_root_leaves,omitzero"`
	// What phases 1 and 2 last for, in seconds: the longest leaf the old key signed
	// and the longest signed in phase 1 so far (the signer's -max-ttl when unknown).
	OldKeyLongest int64 `json:"old_key_longest_s,omitempty"`
	Phase1Longest int64 `json:"phase1_longest_s,omitempty"`
}

func (RotateReply) EventType() string { return TypeRotateReply }
func (e RotateReply) Validate() error {
	var f fields
	if e.Error != nil {
		f.nonEmpty(e.Error.Code, "error.code")
		return f.err()
	}
	f.nonEmpty(e.Fingerprint, "fingerprint")
	f.pems(e.Roots, "roots", 1)
	return f.err()
}

// Reasons for a renewal.
const (
	RenewScheduled    = "scheduled"
	RenewRootRotation = "root-rotation"
	RenewForced       = "forced"
	RenewRetry        = "retry"
)

// RenewDue tells one pod to renew one resource now. It goes to PodRenewSubject(pod)
// and, for audit, to SubjectRenewSent.
type RenewDue struct {
	Pod      PodRef    `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Resource string    `json:"resource,omitempty" jsonschema:"maxLength=253,pattern=^[A-Za-z0-9._:~/-]+$"` // "default" when empty
	Serial   string    `json:"serial,omitempty"`                                                           // the certificate being replaced
	NotAfter time.Time `json:"not_after,omitempty"`
	Reason   string    `json:"reason"`
	Attempt  int       `json:"attempt,omitempty"`
}

func (RenewDue) EventType() string { return TypeRenewDue }
func (e RenewDue) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.resource(e.Resource, "resource")
	f.nonEmpty(e.Reason, "reason")
	f.need(e.Attempt >= 0, "attempt", "must not be negative")
	return f.err()
}

// SecretPushed is published by sds-edge when it serves or pushes a secret.
type SecretPushed struct {
	Pod      PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Resource string `json:"resource"`
	Serial   string `json:"serial,omitempty"` // leaf serial for a certificate resource
	Version  string `json:"version"`
	Streams  int    `json:"streams"`
	Kind     string `json:"kind"` // "served" (answer to a request) or "pushed" (change)
}

func (SecretPushed) EventType() string { return TypeSecretPushed }
func (e SecretPushed) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.Resource, "resource")
	f.nonEmpty(e.Version, "version")
	f.need(e.Streams >= 0, "streams", "must not be negative")
	f.need(e.Kind == "served" || e.Kind == "pushed", "kind", `must be "served" or "pushed"`)
	return f.err()
}

// SDSNack is published by sds-edge when Envoy rejects a secret.
type SDSNack struct {
	Pod      PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Node     string `json:"node"`
	Resource string `json:"resource,omitempty"`
	Version  string `json:"version"`
	Nonce    string `json:"nonce"`
	Error    string `json:"error"`
}

func (SDSNack) EventType() string { return TypeSDSNack }
func (e SDSNack) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.Nonce, "nonce")
	return f.err()
}

// PodUp is published when a pod's sds-edge starts serving; Mode says how it got its
// identity: "ca", "file" or "external" (another SDS provider owns the socket).
type PodUp struct {
	Pod      PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	SPIFFEID string `json:"spiffe_id,omitempty"`
	Mode     string `json:"mode"`
	Socket   string `json:"socket,omitempty"`
}

func (PodUp) EventType() string { return TypePodUp }
func (e PodUp) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.Mode, "mode")
	return f.err()
}

// PodDown is published when a pod's sds-edge stops; the rotator retires its entries.
type PodDown struct {
	Pod    PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Reason string `json:"reason,omitempty"`
}

func (PodDown) EventType() string { return TypePodDown }
func (e PodDown) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	return f.err()
}

// States of the certificate a pod serves, in CertExpiring.
const (
	// CertStateExpiring: less than a tenth of its lifetime is left and the last
	// renewal attempts failed.
	CertStateExpiring = "expiring"
	// CertStateExpired: it is past its NotAfter and still served (Envoy keeps what
	// it has until something newer comes).
	CertStateExpired = "expired"
)

// CertExpiring is published by a pod's sds-edge when the certificate it serves is
// about to expire with no renewal in sight, or has expired: once per certificate
// and state. The pod reports not ready meanwhile.
type CertExpiring struct {
	Pod      PodRef    `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Resource string    `json:"resource"`
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"not_after"`
	State    string    `json:"state"` // CertStateExpiring or CertStateExpired
	// Failures is how many signing attempts in a row failed; LastError the last one's error.
	Failures  int    `json:"failures,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

func (CertExpiring) EventType() string { return TypeCertExpiring }
func (e CertExpiring) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.Resource, "resource")
	f.resource(e.Resource, "resource")
	f.nonEmpty(e.Serial, "serial")
	f.need(!e.NotAfter.IsZero(), "not_after", "required")
	f.need(e.State == CertStateExpiring || e.State == CertStateExpired, "state", "must be expiring or expired")
	f.need(e.Failures >= 0, "failures", "must not be negative")
	return f.err()
}

// XDSConnected is published by xds-relay when a downstream stream is relayed upstream.
type XDSConnected struct {
	Pod      PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Stream   string `json:"stream"`
	Mode     string `json:"mode"` // "sotw" or "delta"
	Node     string `json:"node,omitempty"`
	Upstream string `json:"upstream"`
}

func (XDSConnected) EventType() string { return TypeXDSConnected }
func (e XDSConnected) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.Stream, "stream")
	f.need(e.Mode == "sotw" || e.Mode == "delta", "mode", `must be "sotw" or "delta"`)
	f.nonEmpty(e.Upstream, "upstream")
	return f.err()
}

// XDSDisconnected is published when a relayed stream ends, with the reason.
type XDSDisconnected struct {
	Pod    PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Stream string `json:"stream"`
	Reason string `json:"reason"`
}

func (XDSDisconnected) EventType() string { return TypeXDSDisconnected }
func (e XDSDisconnected) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.Stream, "stream")
	f.nonEmpty(e.Reason, "reason")
	return f.err()
}

// XDSNack is published when Envoy NACKs a relayed response.
type XDSNack struct {
	Pod         PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Stream      string `json:"stream,omitempty"`
	TypeURL     string `json:"type_url"`
	Nonce       string `json:"nonce"`
	Version     string `json:"version,omitempty"`
	ErrorDetail string `json:"error_detail"`
}

func (XDSNack) EventType() string { return TypeXDSNack }
func (e XDSNack) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.TypeURL, "type_url")
	return f.err()
}

// XDSAcked is published when Envoy ACKs a new version of one resource type on an
// ADS stream (once per version and type: a re-ACK of the same version is not news),
// so that an operator sees each pod's sync state (meshctl proxy-status), as
// istioctl proxy-status shows it. In delta mode, which carries no version, the
// first ACK of each type.
type XDSAcked struct {
	Pod     PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Stream  string `json:"stream,omitempty"`
	TypeURL string `json:"type_url"`
	Version string `json:"version,omitempty"`
	Nonce   string `json:"nonce,omitempty"`
}

func (XDSAcked) EventType() string { return TypeXDSAcked }
func (e XDSAcked) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.nonEmpty(e.TypeURL, "type_url")
	return f.err()
}

// TrustAnchors carries extra trust anchors for one pod (from Istio's ProxyConfig,
// received by xds-relay) to that pod's sds-edge, which merges them into ROOTCA.
// Roots replaces the previous set; an empty Roots removes them.
type TrustAnchors struct {
	Pod   PodRef   `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Roots []string `json:"roots"`
}

func (TrustAnchors) EventType() string { return TypeTrustAnchors }
func (e TrustAnchors) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.pems(e.Roots, "roots", 0)
	return f.err()
}

// PodAnchorsSubject is where a pod's xds-relay publishes its extra trust anchors
// for its own sds-edge: only that pod may publish or subscribe there (pkg/bus/policy).
func PodAnchorsSubject(pod PodRef) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return Prefix + ".pod." + pod.tokens() + ".anchors", nil
}
