package events

import (
	"fmt"
	"strings"
)

// The node tier (docs/scale.md, "The node tier"). In a fleet, pods reach the bus
// through their Kubernetes node: each node runs a NATS leaf node (the node agent)
// that admits the node's pods locally and holds one connection to the hub. A pod
// there sends its sign requests on its node's sign subject
//
//	meshagent.rpc.sign.node.<node>.<namespace>.<pod>
//
// The hub lets a node's leaf connection publish below its own node's prefix only
// (pkg/bus/policy.ForNode), so the subject proves which node a request came
// through; the request carries the pod's own token, which the signer verifies
// and whose node claim must name that same node (NodeFromSignSubject). A node
// therefore cannot get a certificate for a pod scheduled on another node, even
// with that pod's stolen token.
const (
	// nodeSignPrefix starts every node sign subject.
	nodeSignPrefix = Prefix + ".rpc.sign.node."
	// SignNodeWildcard matches every node sign subject.
	SignNodeWildcard = Prefix + ".rpc.sign.node.*.*.*"
)

// ValidateNodeName reports whether name can name a Kubernetes node on the bus: a
// DNS-1123 subdomain as ValidatePodID allows (its '.' mapped to '~' in subjects).
func ValidateNodeName(name string) error {
	if err := ValidatePodID(name); err != nil {
		return fmt.Errorf("node name: %w", err)
	}
	return nil
}

// NodeSubjectToken is a node name as one subject token.
func NodeSubjectToken(node string) string { return podToken(node) }

// NodeSignPrefix is the prefix of every sign subject of one node: what the hub
// lets that node's leaf connection publish below.
func NodeSignPrefix(node string) (string, error) {
	if err := ValidateNodeName(node); err != nil {
		return "", err
	}
	return nodeSignPrefix + podToken(node), nil
}

// NodeSignSubject is where pod, on node, sends its sign requests through that
// node's tier.
func NodeSignSubject(node string, pod PodRef) (string, error) {
	prefix, err := NodeSignPrefix(node)
	if err != nil {
		return "", err
	}
	if err := pod.Validate(); err != nil {
		return "", err
	}
	return prefix + "." + pod.tokens(), nil
}

// NodeFromSignSubject is NodeSignSubject's inverse: the node and the pod a node
// sign subject names, and false for any other subject.
func NodeFromSignSubject(subject string) (node string, pod PodRef, ok bool) {
	rest, found := strings.CutPrefix(subject, nodeSignPrefix)
	if !found {
		return "", PodRef{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", PodRef{}, false
	}
	node = strings.ReplaceAll(parts[0], "~", ".")
	if ValidateNodeName(node) != nil {
		return "", PodRef{}, false
	}
	pod, ok = podFromTokens(parts[1], parts[2])
	if !ok {
		return "", PodRef{}, false
	}
	return node, pod, true
}
