package devstack

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubelet"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
)

// The node tier of the local stack (meshctl up -nodes N): N node agents, each a
// leaf node of the embedded hub, admitted by the signer's callout as its node
// by a token of NodeTierAccount bound to the agent's pod and node, as a
// DaemonSet's pods are. The demo pods are spread over them round robin.
const (
	// NodeTierNamespace and NodeTierServiceAccount are the node agents' service
	// account, which the signer admits as node agents (NODE_AGENT_ACCOUNTS).
	NodeTierNamespace, NodeTierServiceAccount = "meshagent-system", "meshagent-node"
	// MaxNodes bounds -nodes: each is a process with a nats-server in it.
	MaxNodes = 50
)

// NodeTierAccount is the node agents' account as NODE_AGENT_ACCOUNTS lists it.
const NodeTierAccount = NodeTierNamespace + "/" + NodeTierServiceAccount

// NodeName is the name of the stack's i-th node.
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// nodeOf is the node demo pod i runs on ("" without a node tier).
func (r *Runner) nodeOf(i int) string {
	if r.cfg.Nodes == 0 {
		return ""
	}
	return NodeName(i % r.cfg.Nodes)
}

// podNATSURL is where pod connects: its node's agent, or the hub.
func (r *Runner) podNATSURL(pod stackfile.Pod) string {
	for _, n := range r.Stack.Nodes {
		if n.Name == pod.Node {
			return "nats://" + n.Bus
		}
	}
	return r.natsURL()
}

// startNodes starts the node agents, each with its own token (kept fresh with
// the pods'), and waits for each to be connected to the hub (its /readyz).
func (r *Runner) startNodes(ctx context.Context) error {
	if r.cfg.Nodes == 0 {
		return nil
	}
	addrs, err := supervisor.FreeAddrs(2 * r.cfg.Nodes)
	if err != nil {
		return err
	}
	for i := range r.cfg.Nodes {
		node := stackfile.Node{Name: NodeName(i), Bus: addrs[2*i], HTTP: addrs[2*i+1]}
		tok := kubelet.Token{File: filepath.Join(r.cfg.Dir, "nodes", node.Name, "token"), Namespace: NodeTierNamespace,
			ServiceAccount: NodeTierServiceAccount, Pod: "meshagent-node-" + strings.TrimPrefix(node.Name, "node-"), Node: node.Name}
		r.kube.Tokens = append(r.kube.Tokens, tok)
		if err := r.kube.Write(tok, time.Now()); err != nil {
			return err
		}
		ti := r.Stack.TokenIssuer
		p, err := r.process(node.Name, "node-agent", node.HTTP, "", []string{
			"-node", node.Name, "-hub", r.Stack.LeafURL, "-token-file", tok.File, "-listen", node.Bus,
			"-trust-domain", r.cfg.TrustDomain, "-jwks-file", ti.JWKS, "-token-issuer", ti.Issuer, "-token-audience", ti.Audience})
		if err != nil {
			return err
		}
		if err := r.start(ctx, p); err != nil {
			return err
		}
		r.Stack.Nodes = append(r.Stack.Nodes, node)
	}
	return nil
}
