package policy

import (
	"slices"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// The node tier (docs/scale.md, docs/security.md "The node tier"): a node agent on
// each Kubernetes node runs a NATS leaf node. The hub's auth callout admits the
// leaf's one connection by the node agent's own token (a node), and the node
// agent's callout admits the node's pods on the leaf by theirs. What crosses the
// leaf connection is bounded by the node's permissions on the hub (ForNode):
// nats-server sends the hub only what the node may publish and asks it only for
// what the node may subscribe to.

// Node is the role of a node agent's leaf connection on the hub.
const Node Role = "node"

// LeafClientKind is the kind nats-server names a leaf node connection by in an
// auth callout request (jwt.ClientInformation.Kind).
const LeafClientKind = "Leafnode"

// ForNode returns the permissions of node's leaf connection on the hub: its own
// node's sign subjects (also in the replica form) and the signers' ping, the
// trust bundle and the last federated roots, every pod's events (their stream
// bounds each pod and kind), and, to read: pods' commands, trust changes and
// pods' inboxes. It can sign nothing below another node's prefix, and the signer
// checks that the pod's token names this node (events.NodeFromSignSubject).
func ForNode(node string) (Permissions, error) {
	prefix, err := events.NodeSignPrefix(node)
	if err != nil {
		return Permissions{}, err
	}
	// Pods' events as one wildcard, not one per kind (meshagent.evt.pod.*.*.<kind>):
	// nats-server sends a leaf the hub's interest in a wildcard subject only when
	// a permission lies under it, and its reverse match does not look below a '*'
	// token, so the pod-event stream's meshagent.evt.pod.> never reached the
	// node and every pod's event through it found no responders. The leaf's own
	// callout still gives each pod only its own events (ForNodePod).
	publish := []string{prefix + ".>", events.ReplicaSignPattern(prefix + ".>"), events.SubjectSignerPing,
		events.SubjectTrustBundle, events.TrustFederatedLastWildcard, events.PodEventsWildcard}
	return Permissions{
		Publish:   publish,
		Subscribe: []string{events.Prefix + ".pod.>", events.SubjectTrustChanged, events.TrustFederatedWildcard, "_INBOX.pod.>"},
	}, nil
}

// ForNodePod returns the permissions the node agent's callout gives pod on node's
// leaf: ForPod's, with the pod's sign subject on the node tier (events.NodeSignSubject,
// also in the replica form) instead of its hub sign subject.
func ForNodePod(node string, pod events.PodRef) (Permissions, error) {
	p, err := ForPod(pod)
	if err != nil {
		return Permissions{}, err
	}
	hub, _ := events.PodSignSubject(pod)
	sign, err := events.NodeSignSubject(node, pod)
	if err != nil {
		return Permissions{}, err
	}
	p.Publish = slices.DeleteFunc(p.Publish, func(s string) bool { return s == hub || s == events.ReplicaSignPattern(hub) })
	p.Publish = append(p.Publish, sign, events.ReplicaSignPattern(sign))
	return p, nil
}

// AdmitNode answers the hub's callout request for node's leaf connection with a
// user in AccountMesh holding ForNode(node)'s permissions until expires.
func AdmitNode(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, node string, expires time.Time) ([]byte, error) {
	p, err := ForNode(node)
	if err != nil {
		return nil, err
	}
	return admitUser(issuer, req, "node/"+node, p, expires, nil)
}

// RenderLeaf writes the configuration of a node agent's leaf server: the mesh
// account, which the leaf binds to the hub and its pods are admitted into (by the
// node agent inside the server, embedded.Leaf.Admit, not by an auth callout). The
// leaf remote (the hub's URL and the node's token) is set on the server's
// options, not here: the token is a secret and changes.
func RenderLeaf() string {
	return "# meshagent node tier: a leaf node admitting this node's pods (pkg/bus/policy, docs/security.md).\n" +
		"accounts {\n  " + AccountMesh + " {}\n}\n"
}
