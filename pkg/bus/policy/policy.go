// Package policy is who may do what on the meshagent bus: one table of roles and
// their NATS permissions (allow-lists; everything else is denied), written once and
// rendered both into the embedded server's configuration and into a nats-server
// config fragment for a fleet, plus the user JWTs the auth callout issues to pods.
package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshagent/meshagent/pkg/events"
)

// Role is what a bus user is for.
type Role string

// The roles. Every user of the bus holds exactly one.
const (
	Signer  Role = "signer"  // the CA replicas
	Rotator Role = "rotator" // the renewal schedule
	Admin   Role = "admin"   // an operator's meshctl
	Audit   Role = "audit"   // read-only event consumers (audit, metrics)
	// Inventory keeps the fleet's certificate inventory (the operator service): it reads the
	// events through its own durable and writes its own bucket, which audit may read.
	Inventory Role = "inventory"
	Callout   Role = "callout" // the auth-callout responder inside the signer
	Pod       Role = "pod"     // one pod's sds-edge, xds-relay and launcher, admitted by the callout
)

// Users are the roles that hold an nkey (every role but Pod, whose users the callout
// creates per connection).
var Users = []Role{Signer, Rotator, Admin, Audit, Callout, Inventory}

// Accounts. Every service and every pod lives in Mesh; the callout responder alone
// lives in Auth, so that it sees connect requests and nothing else.
const (
	AccountMesh = "MESHAGENT"
	AccountAuth = "AUTH"
)

// Names of the JetStream state the table grants access to (the services' defaults).
const (
	BucketCA = "meshagent-ca"
	// BucketIssued records which pod each certificate was issued to (signer only):
	// the auth callout admits a pod by its certificate only with such a record.
	BucketIssued       = "meshagent-issued"
	BucketRotator      = "meshagent_rotator"
	BucketRotatorLease = "meshagent_rotator_lease"
	RotatorConsumer    = "rotator"
	BucketInventory    = "meshagent_inventory"
	InventoryConsumer  = "inventory"
)

// AuthCalloutSubject is where nats-server sends connect requests to the callout.
const AuthCalloutSubject = "$SYS.REQ.USER.AUTH"

// Permissions are one user's allow-lists. A subscribe entry may name a queue group
// after a space ("subject queue"): then only that queue may subscribe.
type Permissions struct {
	Publish   []string
	Subscribe []string
	// Responses lets the user publish one reply to each request it received
	// (nats-server's allow_responses), whatever the reply subject.
	Responses bool
}

// Inbox is the reply-subject prefix of a role (nats.CustomInboxPrefix); every role
// may subscribe only below its own. pod is the pod for Pod (namespace and name: one
// pod's replies never reach a pod of the same name in another namespace) and
// ignored otherwise.
func Inbox(r Role, pod events.PodRef) string {
	if r == Pod {
		in, err := events.PodInboxPrefix(pod)
		if err != nil {
			return "_INBOX.pod.invalid" // never reached: callers validate the pod first
		}
		return in
	}
	return "_INBOX." + string(r)
}

// For returns the permissions of a role that holds an nkey.
func For(r Role) (Permissions, error) {
	var p Permissions
	switch r {
	case Signer:
		p = Permissions{
			Publish: cat(
				[]string{events.SubjectCertIssued, events.SubjectTrustChanged, events.TrustFederatedWildcard},
				// The signer alone creates (and may update) both event streams.
				streamManage(events.StreamEvents),
				streamManage(events.StreamPodEvents),
				// Reads the last trust.changed, so that a change is announced once.
				streamRead(events.StreamEvents)[1:],
				kvBucket(BucketCA),
				kvBucket(BucketIssued),
			),
			Subscribe: []string{
				events.SignWildcard + " " + events.SignerQueue,
				events.SubjectTrustBundle + " " + events.SignerQueue,
				events.SubjectRootRotate + " " + events.SignerQueue,
				// Its own replica sign subjects and the ping (events.SubjectSignerPing),
				// no queue group: a requester whose request waited out a frozen
				// replica asks a live one by name.
				events.SignerReplicaWildcard,
			},
			Responses: true,
		}
	case Rotator:
		p = Permissions{
			Publish: cat(
				[]string{events.PodRenewWildcard, events.SubjectRenewSent, events.SubjectTrustBundle},
				streamRead(events.StreamEvents),
				durable(events.StreamEvents, RotatorConsumer),
				// pod.down, from the pods' own stream.
				streamRead(events.StreamPodEvents),
				durable(events.StreamPodEvents, RotatorConsumer),
				kvBucket(BucketRotator),
				kvBucket(BucketRotatorLease),
			),
		}
	case Admin:
		p = Permissions{
			Publish: cat(
				[]string{events.SubjectRootRotate, events.PodRenewWildcard, events.SubjectSignAny, events.SubjectTrustBundle},
				// Read only: whoever may update the stream could make it capture sign
				// requests (bearer tokens) or source the CA bucket. The signer creates it.
				streamRead(events.StreamEvents),
				streamRead(events.StreamPodEvents),
				streamRead("KV_"+BucketInventory),
			),
			Subscribe: []string{events.EventsWildcard},
		}
	case Audit:
		p = Permissions{
			// The events, the inventory (read by sequence, like the events) and the
			// trust bundle (public roots, as any pod may ask).
			Publish: cat([]string{events.SubjectTrustBundle}, streamRead(events.StreamEvents), streamRead(events.StreamPodEvents),
				streamRead("KV_"+BucketInventory)),
			Subscribe: []string{events.EventsWildcard},
		}
	case Inventory:
		p = Permissions{
			Publish: cat(
				[]string{events.SubjectTrustBundle},
				streamRead(events.StreamEvents),
				durable(events.StreamEvents, InventoryConsumer),
				streamRead(events.StreamPodEvents),
				durable(events.StreamPodEvents, InventoryConsumer),
				kvBucket(BucketInventory),
			),
			Subscribe: []string{events.EventsWildcard},
		}
	case Callout:
		p = Permissions{Subscribe: []string{AuthCalloutSubject}, Responses: true}
	default:
		return Permissions{}, fmt.Errorf("role %q holds no nkey (pods are admitted by the auth callout)", r)
	}
	p.Subscribe = append(p.Subscribe, Inbox(r, events.PodRef{})+".>")
	return p, nil
}

// ForPod returns the permissions of one pod (namespace and name): its own
// subjects (its sign subject also in the replica form, events.ReplicaSignPattern,
// with the replicas' ping), the trust bundle, and publishing its events (JetStream's acks come to
// its inbox); nothing of another pod — a pod of the same name in another namespace
// is another pod — and of JetStream's API only the last trust.federated of each
// foreign domain (events.TrustFederatedLastWildcard: a direct get by subject,
// which reads nothing else of the CA's history), so that a new pod holds the
// foreign roots at once. Its extra trust anchors
// (events.PodAnchorsSubject) are among its own subjects: it alone may publish and
// read them.
func ForPod(pod events.PodRef) (Permissions, error) {
	sign, err := events.PodSignSubject(pod)
	if err != nil {
		return Permissions{}, err
	}
	anchors, _ := events.PodAnchorsSubject(pod)
	renew, _ := events.PodRenewSubject(pod)
	own := strings.TrimSuffix(renew, "renew") + ">"
	publish := []string{sign, events.ReplicaSignPattern(sign), events.SubjectSignerPing, events.SubjectTrustBundle, anchors, events.TrustFederatedLastWildcard}
	for _, kind := range events.PodEventKinds {
		subj, _ := events.PodEventSubject(pod, kind)
		publish = append(publish, subj)
	}
	return Permissions{
		Publish:   publish,
		Subscribe: []string{own, events.SubjectTrustChanged, events.TrustFederatedWildcard, Inbox(Pod, pod) + ".>"},
	}, nil
}

// ForPodIdentity is ForPod plus publishing on the pod's identity sign subject
// (events.IdentitySignSubject(pod, sa); its namespace is the pod's), also in the
// replica form (events.ReplicaSignPattern). Only the auth
// callout grants it, from a token it verified: no role that holds an nkey may
// publish below meshagent.rpc.sign.id, or a signer reading identities from those
// subjects would believe it.
func ForPodIdentity(pod events.PodRef, sa string) (Permissions, error) {
	id, err := events.IdentitySignSubject(pod, sa)
	if err != nil {
		return Permissions{}, err
	}
	p, err := ForPod(pod)
	if err != nil {
		return Permissions{}, err
	}
	p.Publish = append(p.Publish, id, events.ReplicaSignPattern(id))
	return p, nil
}

// cat joins subject lists, keeping the first of duplicates.
func cat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, s := range l {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}
