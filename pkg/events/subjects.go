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

	SubjectCertIssued    = Prefix + ".evt.cert.issued"
	SubjectTrustChanged  = Prefix + ".evt.trust.changed"
	SubjectRenewSent     = Prefix + ".evt.rotation.renew_sent"
	SubjectSecretPushed  = Prefix + ".evt.sds.pushed"
	SubjectSDSNack       = Prefix + ".evt.sds.nack"
	SubjectPodUp         = Prefix + ".evt.pod.up"
	SubjectPodDown       = Prefix + ".evt.pod.down"
	SubjectXDSConnected  = Prefix + ".evt.xds.connected"
	SubjectXDSDisconnect = Prefix + ".evt.xds.disconnected"
	SubjectXDSNack       = Prefix + ".evt.xds.nack"

	SubjectSign        = Prefix + ".rpc.sign"
	SubjectTrustBundle = Prefix + ".rpc.trust.bundle"
	SubjectRootRotate  = Prefix + ".rpc.root.rotate"

	// SignerQueue is the queue group signers answer SubjectSign in.
	SignerQueue = "signer"

	// StreamEvents is the JetStream stream that keeps the event history.
	StreamEvents = "MESHAGENT_EVENTS"
)

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
func PodRenewSubject(podID string) (string, error) {
	if err := ValidatePodID(podID); err != nil {
		return "", err
	}
	return Prefix + ".pod." + podToken(podID) + ".renew", nil
}

// PodRenewWildcard matches the renew subject of every pod.
const PodRenewWildcard = Prefix + ".pod.*.renew"
