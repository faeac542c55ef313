package buscallout

import (
	"fmt"
	"slices"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/jwt/v2"
)

// Reasons a node's leaf connection is refused.
const (
	// ReasonNotANodeAgent: a leaf connection whose token is not a node agent's
	// (-node-agent-accounts), or a signer that admits no nodes.
	ReasonNotANodeAgent = "not_a_node_agent"
	// ReasonNoNode: a node agent's token that names no node (kubernetes.io.node.name).
	ReasonNoNode = "no_node"
)

// NodeAgents lets leaf connections in whose token is of one of these service
// accounts (<ns>/<sa>), each as the node its token is bound to
// (policy.ForNode); none: no leaf connection is admitted. Call it before Run.
func (r *Responder) NodeAgents(accounts []string) *Responder {
	r.nodeAgents = slices.Clone(accounts)
	return r
}

// decideNode admits a node agent's leaf connection as its node, until its token
// expires: the node agent reconnects with its next token (it reads its file
// again). A node's connection carries every pod of the node, so it is never
// counted against a pod's admissions.
func (r *Responder) decideNode(req *jwt.AuthorizationRequestClaims, refuse func(string, error) ([]byte, error)) ([]byte, error) {
	if len(r.nodeAgents) == 0 {
		return refuse(ReasonNotANodeAgent, fmt.Errorf("this signer admits no node tier (-node-agent-accounts)"))
	}
	caller, reason, err := r.byToken(req.ConnectOptions.Token)
	if err != nil {
		return refuse(reason, err)
	}
	if err := r.isNodeAgent(caller); err != nil {
		return refuse(ReasonNotANodeAgent, err)
	}
	if caller.Node == "" {
		return refuse(ReasonNoNode, fmt.Errorf("node agent %s's token names no node (kubernetes.io.node.name, Kubernetes 1.32 on)", caller.Pod))
	}
	resp, err := policy.AdmitNode(r.issuer, req, caller.Node, caller.Expires)
	if err != nil {
		return refuse(ReasonBadToken, err)
	}
	r.nodesAdmitted.Inc()
	r.log.Info("node admitted to the bus", "node", caller.Node, "node_agent", caller.Pod, "until", caller.Expires.UTC().Format(time.RFC3339))
	return resp, nil
}

// isNodeAgent reports whether caller's identity is one of the node agents'.
func (r *Responder) isNodeAgent(caller authn.Caller) error {
	_, ns, sa, err := pki.ParseWorkloadID(caller.ID.String())
	if err != nil {
		return err
	}
	if !slices.Contains(r.nodeAgents, ns+"/"+sa) {
		return fmt.Errorf("%s is not a node agent (-node-agent-accounts %v)", caller.ID, r.nodeAgents)
	}
	if err := events.ValidateNodeName(caller.Node); caller.Node != "" && err != nil {
		return err
	}
	return nil
}
