package natsapi

import (
	"strings"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
)

// replyToRequester reports whether reply, an inbox, is one the requester of a
// request on subject may hold. A role's inbox (_INBOX.<role>., a pod's
// _INBOX.pod.<ns>.<name>., pkg/bus/policy) is only its own role's: nats-server
// checks what a client publishes, not the reply subject it names, so a pod could
// otherwise have the signer publish into another pod's inbox. A pod sign subject
// (any of its forms, its node tier's included) proves the pod, and only that pod's inbox is answered; only
// the admin asks on SubjectSignAny and SubjectRootRotate, never a pod. The bundle
// and the ping are asked by every role on one subject that proves nobody: their
// answer is public. An inbox under no role (_INBOX.<nuid>, an unsecured bus's
// default) is no one's on a secured bus, where no role may subscribe to it.
func replyToRequester(subject, reply string) bool {
	if reply == "" || !strings.HasPrefix(reply, podInboxes) {
		return true
	}
	if sign, _, ok := events.SignSubjectOfReplica(subject); ok {
		subject = sign
	}
	pod, ok := events.PodFromSubject(subject)
	if !ok {
		pod, _, ok = events.IdentityFromSignSubject(subject)
	}
	if !ok {
		_, pod, ok = events.NodeFromSignSubject(subject)
	}
	switch {
	case ok:
		return strings.HasPrefix(reply, policy.Inbox(policy.Pod, pod)+".")
	case subject == events.SubjectSignAny, subject == events.SubjectRootRotate:
		return false
	default:
		return true
	}
}

// podInboxes is the prefix of every pod's inbox.
var podInboxes = "_INBOX." + string(policy.Pod) + "."
