package events

import (
	"fmt"
	"strings"
)

// Subject prefixes and names. Every subject meshagent uses is built here.
const (
	// Prefix is the root of every meshagent subject.
	Prefix = "meshagent"
	// EventsWildcard matches every event (not requests, not commands).
	EventsWildcard = Prefix + ".evt.>"

	SubjectCertIssued   = Prefix + ".evt.cert.issued"
	SubjectTrustChanged = Prefix + ".evt.trust.changed"
	SubjectRenewSent    = Prefix + ".evt.rotation.renew_sent"

	// Requests. Signing is pod-scoped (PodSignSubject); SubjectSignAny is for callers
	// that are no pod (an operator's meshctl). Signers answer SignWildcard.
	SubjectSignAny     = Prefix + ".rpc.sign.any"
	SignWildcard       = Prefix + ".rpc.sign.>"
	SubjectTrustBundle = Prefix + ".rpc.trust.bundle"
	SubjectRootRotate  = Prefix + ".rpc.root.rotate"

	// SignerQueue is the queue group signers answer SignWildcard in.
	SignerQueue = "signer"

	// StreamEvents is the JetStream stream that keeps the CA's history (the audit
	// log): CAEventSubjects, which only the signer and the rotator may publish on.
	StreamEvents = "MESHAGENT_EVENTS"
	// StreamPodEvents keeps what pods publish about themselves (PodEventsWildcard),
	// apart from the CA's history and bounded per subject, so that a flood from one
	// pod can crowd out only that pod's own events (docs/security.md).
	StreamPodEvents = "MESHAGENT_POD_EVENTS"
	// PodEventsWildcard matches every pod's events.
	PodEventsWildcard = Prefix + ".evt.pod.>"
)

// CAEventSubjects are the subjects of the CA's history (StreamEvents): every event
// that is not a pod's. A stream's subjects may not overlap another's, so they are
// listed rather than "everything but meshagent.evt.pod.>"; a new kind of CA event
// needs its prefix here (TestCAEventSubjectsCoverEveryEvent).
var CAEventSubjects = []string{
	Prefix + ".evt.cert.>",
	Prefix + ".evt.trust.>",
	Prefix + ".evt.rotation.>",
}

// StreamOf names the stream an event subject is kept in ("" for none).
func StreamOf(subject string) string {
	if strings.HasPrefix(subject, podEventPrefix) {
		return StreamPodEvents
	}
	for _, w := range CAEventSubjects {
		if strings.HasPrefix(subject, strings.TrimSuffix(w, ">")) {
			return StreamEvents
		}
	}
	return ""
}

// ValidatePodID reports whether id can name a pod on the bus: Kubernetes pod names
// (DNS-1123 subdomains) plus upper case and '_', 1-253 characters, starting and ending
// alphanumeric. '.' is mapped to '~' in subjects, which pod ids may not contain.
//
// A loop, not a regexp: compiling `{0,251}` costs every service ~0.6 MB of stack at
// start-up that is never given back.
func ValidatePodID(id string) error {
	ok := len(id) >= 1 && len(id) <= 253 && isAlnum(id[0]) && isAlnum(id[len(id)-1]) && allIn(id, "._-")
	if !ok {
		return fmt.Errorf("invalid pod id %q: want 1-253 of [A-Za-z0-9._-], starting and ending alphanumeric", id)
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// allIn reports whether every byte of s is alphanumeric or one of extra.
func allIn(s, extra string) bool {
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && !strings.ContainsRune(extra, rune(s[i])) {
			return false
		}
	}
	return true
}

func podToken(id string) string { return strings.ReplaceAll(id, ".", "~") }

// PodRenewSubject is the subject a pod's sds-edge listens on for renew-due commands.
func PodRenewSubject(pod PodRef) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return Prefix + ".pod." + pod.tokens() + ".renew", nil
}

// PodRenewWildcard matches the renew subject of every pod.
const PodRenewWildcard = Prefix + ".pod.*.*.renew"

// Everything a pod publishes or is told carries its namespace and name in the
// subject, as two tokens, so that the bus itself (NATS permissions) can allow each
// pod its own subjects and no other's, and a pod of one namespace is never the pod
// of the same name in another:
//
//	meshagent.rpc.sign.pod.<ns>.<name>        sign requests from the pod
//	meshagent.evt.pod.<ns>.<name>.<kind>      the pod's events (kinds below)
//	meshagent.pod.<ns>.<name>.renew|anchors   commands and anchors to the pod
//
// Receivers still check that a payload's pod matches its subject (PodFromSubject).

// Kinds of pod events (the last tokens of PodEventSubject).
const (
	PodEventUp              = "up"
	PodEventDown            = "down"
	PodEventSecretPushed    = "sds.pushed"
	PodEventSDSNack         = "sds.nack"
	PodEventXDSConnected    = "xds.connected"
	PodEventXDSDisconnected = "xds.disconnected"
	PodEventXDSNack         = "xds.nack"
	PodEventXDSAcked        = "xds.acked"
	PodEventEnvoyStarted    = "envoy.started"
	PodEventEnvoyReady      = "envoy.ready"
	PodEventEnvoyDraining   = "envoy.draining"
	PodEventEnvoyExited     = "envoy.exited"
	PodEventCertExpiring    = "cert.expiring"
	PodEventParts           = "parts"
)

// PodEventKinds are every kind a pod may publish: a pod's bus permission names
// each (pkg/bus/policy), not its whole event subtree, so that it cannot spread a
// flood over subjects of its own making and crowd other pods' events out of their
// stream's bytes. A new kind goes here too, or no pod can publish it.
var PodEventKinds = []string{
	PodEventUp, PodEventDown, PodEventSecretPushed, PodEventSDSNack, PodEventXDSConnected,
	PodEventXDSDisconnected, PodEventXDSNack, PodEventXDSAcked, PodEventEnvoyStarted,
	PodEventEnvoyReady, PodEventEnvoyDraining, PodEventEnvoyExited, PodEventCertExpiring,
	PodEventParts,
}

// podEventPrefix starts every pod event subject.
const podEventPrefix = Prefix + ".evt.pod."

// podSignPrefix starts every pod sign subject.
const podSignPrefix = Prefix + ".rpc.sign.pod."

// PodSignSubject is where a pod's sds-edge sends its sign requests.
func PodSignSubject(pod PodRef) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return podSignPrefix + pod.tokens(), nil
}

// PodEventSubject is where a pod publishes events of one kind (PodEvent*).
func PodEventSubject(pod PodRef, kind string) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return podEventPrefix + pod.tokens() + "." + kind, nil
}

// PodEventWildcard matches one kind of event from every pod.
func PodEventWildcard(kind string) string { return podEventPrefix + "*.*." + kind }

// PodEventsOf matches every event of one pod.
func PodEventsOf(pod PodRef) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return podEventPrefix + pod.tokens() + ".>", nil
}

// PodInboxPrefix is the reply-subject prefix of one pod (nats.CustomInboxPrefix):
// only that pod may subscribe below it (pkg/bus/policy).
func PodInboxPrefix(pod PodRef) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return "_INBOX.pod." + pod.tokens(), nil
}

// PodFromSubject returns the pod a pod-scoped subject names (a sign request, a pod
// event or a command to a pod), and false for any other subject.
func PodFromSubject(subject string) (PodRef, bool) {
	var rest string
	switch {
	case strings.HasPrefix(subject, podSignPrefix):
		rest = strings.TrimPrefix(subject, podSignPrefix)
		if strings.Count(rest, ".") != 1 {
			return PodRef{}, false
		}
	case strings.HasPrefix(subject, podEventPrefix):
		rest = strings.TrimPrefix(subject, podEventPrefix)
	case strings.HasPrefix(subject, Prefix+".pod."):
		rest = strings.TrimPrefix(subject, Prefix+".pod.")
	default:
		return PodRef{}, false
	}
	parts := strings.SplitN(rest, ".", 3)
	if len(parts) < 2 {
		return PodRef{}, false
	}
	return podFromTokens(parts[0], parts[1])
}

// PodEventKind returns the kind of a pod event subject ("up", "sds.pushed", ...).
func PodEventKind(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, podEventPrefix)
	if _, valid := PodFromSubject(subject); !ok || !valid {
		return "", false
	}
	parts := strings.SplitN(rest, ".", 3)
	if len(parts) != 3 || parts[2] == "" {
		return "", false
	}
	return parts[2], true
}

// Signing by identity (docs/security.md, "Authenticating bus sign requests once per
// connection"). The bus auth callout lets a pod publish on
//
//	meshagent.rpc.sign.id.<namespace>.<service account>.<pod>
//
// computed from the token it verified when it admitted the connection, and no other
// role may publish there; so a signer told so (-bus-sign-id) takes the caller's
// identity from the subject (IdentityFromSignSubject) instead of verifying the token
// of every request. The trust domain is the signer's own.
const (
	// SignIDWildcard matches every identity sign subject.
	SignIDWildcard = Prefix + ".rpc.sign.id.*.*.*"
	// SignPodWildcard matches every pod sign subject.
	SignPodWildcard = Prefix + ".rpc.sign.pod.*.*"
	signIDPrefix    = Prefix + ".rpc.sign.id."
)

// ValidateIdentityToken reports whether name (a namespace or a service account) can
// be one subject token as it is: 1-253 of [A-Za-z0-9_-], starting and ending
// alphanumeric. Kubernetes namespaces (DNS labels) always can; a name that cannot
// is refused, never escaped, so that two identities never share a subject.
func ValidateIdentityToken(name string) error {
	ok := len(name) >= 1 && len(name) <= 253 && isAlnum(name[0]) && isAlnum(name[len(name)-1]) && allIn(name, "_-")
	if !ok {
		return fmt.Errorf("name %q cannot be one subject token: want 1-253 of [A-Za-z0-9_-], starting and ending alphanumeric", name)
	}
	return nil
}

// IdentitySignSubject is where a pod admitted by the auth callout as pod (whose
// namespace is its identity's namespace) and service account sa sends its sign
// requests: meshagent.rpc.sign.id.<pod namespace>.<sa>.<pod name>.
func IdentitySignSubject(pod PodRef, sa string) (string, error) {
	if err := pod.Validate(); err != nil {
		return "", err
	}
	if err := ValidateIdentityToken(sa); err != nil {
		return "", fmt.Errorf("service account: %w", err)
	}
	return signIDPrefix + pod.Namespace + "." + sa + "." + podToken(pod.Name), nil
}

// IdentityFromSignSubject is IdentitySignSubject's inverse: the pod (its namespace
// the identity's) and service account an identity sign subject names, and false
// for any other subject.
func IdentityFromSignSubject(subject string) (pod PodRef, sa string, ok bool) {
	rest, found := strings.CutPrefix(subject, signIDPrefix)
	if !found {
		return PodRef{}, "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return PodRef{}, "", false
	}
	pod, ok = podFromTokens(parts[0], parts[2])
	if !ok || ValidateIdentityToken(parts[1]) != nil {
		return PodRef{}, "", false
	}
	return pod, parts[1], true
}
