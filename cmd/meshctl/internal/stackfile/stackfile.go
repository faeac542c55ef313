// Package stackfile is stack.json, what the local stack of meshctl up (devstack)
// tells a user, a script or the operator's commands about what runs where: the bus
// and the operator's credentials, the signer's addresses, each pod's sockets and
// certificates, each child process. devstack writes it; status, sign, sds, events
// and rotate read it when no flag names a bus.
package stackfile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshagent/meshagent/pkg/atomicfile"
)

// FileName is the name of the stack description inside the state directory.
const FileName = "stack.json"

// Stack is what stack.json holds. Field names are part of meshctl's interface.
type Stack struct {
	Version     int    `json:"version"`
	Dir         string `json:"dir"`
	TrustDomain string `json:"trust_domain"`
	NATSURL     string `json:"nats_url"`
	// NATSTLSCA is the bus CA: the local bus also speaks TLS on the same port
	// (its services stay on plaintext loopback), where a pod with no token (a VM)
	// presents its mesh certificate to be admitted. Verify the server with it.
	NATSTLSCA string `json:"nats_tls_ca,omitempty"`
	// LeafURL is the hub's leaf node listener (loopback, plaintext): the node
	// tier's node agents connect there, each admitted by the signer's callout as
	// its node (NODE_AGENT_ACCOUNTS).
	LeafURL string `json:"leaf_url,omitempty"`
	// NATSMonitor is the hub's HTTP monitoring listener (nats-server's /varz,
	// /connz, /leafz), on loopback.
	NATSMonitor string `json:"nats_monitor,omitempty"`
	// NodeAgentAccount is the service account (namespace/name) whose pod-bound,
	// node-bound tokens the signer's callout admits as node agents on the leaf
	// listener (NODE_AGENT_ACCOUNTS).
	NodeAgentAccount string `json:"node_agent_account,omitempty"`
	// NATSAdminNKey and NATSAuditNKey are the seed files of the operator's and the
	// read-only bus credentials (pkg/bus/policy roles admin and audit). The other
	// roles' seeds are given to their services only and are not named here.
	NATSAdminNKey string        `json:"nats_admin_nkey"`
	NATSAuditNKey string        `json:"nats_audit_nkey"`
	TrustBundle   string        `json:"trust_bundle"`
	TokenIssuer   TokenIssuer   `json:"token_issuer"`
	Signer        Signer        `json:"signer"`
	Rotator       Service       `json:"rotator"`
	ControlPlane  *ControlPlane `json:"control_plane,omitempty"`
	// Dashboard is the HTTP address of the operator service's page, API and fleet metrics.
	Dashboard string `json:"dashboard,omitempty"`
	// Nodes are the node tier's node agents (meshctl up -nodes N); none: every
	// pod connects to the hub itself.
	Nodes     []Node    `json:"nodes,omitempty"`
	Pods      []Pod     `json:"pods"`
	Processes []Process `json:"processes"`
}

// Node is one node agent of the node tier: the node it serves, where that
// node's pods connect (host:port) and its health and metrics address.
type Node struct {
	Name string `json:"name"`
	Bus  string `json:"bus"`
	HTTP string `json:"http"`
}

// TokenIssuer is the local issuer whose tokens the signer accepts.
type TokenIssuer struct {
	Issuer   string `json:"issuer"`
	Audience string `json:"audience"`
	JWKS     string `json:"jwks"`
}

// Signer says where the CA answers.
type Signer struct {
	Service
	NATSSubject    string `json:"nats_subject"`
	GRPCAddr       string `json:"grpc_addr"`
	GRPCServerName string `json:"grpc_server_name"`
	// CertSigners are the named signers besides the default (CERT_SIGNERS).
	CertSigners []string `json:"cert_signers,omitempty"`
	// TrustedNodeAccounts may ask for the identity of a pod on their node
	// (CA_TRUSTED_NODE_ACCOUNTS), checked against NodeAPI's pods.
	TrustedNodeAccounts []string `json:"trusted_node_accounts,omitempty"`
	NodeAPI             string   `json:"node_api,omitempty"`
	// BundleEndpoint serves this trust domain's SPIFFE bundle (https_web), its
	// certificate chaining to BundleEndpointCA.
	BundleEndpoint   string `json:"bundle_endpoint,omitempty"`
	BundleEndpointCA string `json:"bundle_endpoint_ca,omitempty"`
	// Federate is the foreign trust domains followed (SPIFFE_BUNDLE_ENDPOINTS).
	Federate string `json:"federate,omitempty"`
}

// Service is one HTTP (health and metrics) endpoint.
type Service struct {
	HTTP string `json:"http"`
}

// ControlPlane is the demo xDS server the pods' relays connect to.
type ControlPlane struct {
	XDSAddr string `json:"xds_addr"`
}

// Pod is one demo workload.
type Pod struct {
	ID             string            `json:"id"`
	Namespace      string            `json:"namespace"`
	ServiceAccount string            `json:"service_account"`
	SPIFFEID       string            `json:"spiffe_id"`
	Root           string            `json:"root"`
	SDSSocket      string            `json:"sds_socket"`
	XDSSocket      string            `json:"xds_socket"`
	TokenFile      string            `json:"token_file"`
	OutputCerts    string            `json:"output_certs"`
	HTTP           map[string]string `json:"http"`
	// Envoy is what the launcher runs: Envoy from PATH, or the stand-in.
	Envoy string `json:"envoy"`
	// Status is the launcher's status port (Istio's 15020): /healthz/ready,
	// /stats/prometheus, /quitquitquit, /drain.
	Status string `json:"status"`
	// NodeID is the pod's Envoy node id, as Istio builds it.
	NodeID string `json:"node_id"`
	// DNS is the pod's DNS proxy (xds-relay's, UDP and TCP); empty: none.
	DNS string `json:"dns,omitempty"`
	// Node is the node the pod runs on when the stack has a node tier: it
	// reaches the bus through that node's agent. Empty: directly.
	Node string `json:"node,omitempty"`
}

// Process is one child process.
type Process struct {
	Name string `json:"name"`
	PID  int    `json:"pid"`
	HTTP string `json:"http"`
	Log  string `json:"log"`
}

// Write stores s as dir/stack.json atomically.
func Write(dir string, s *Stack) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode stack: %w", err)
	}
	return atomicfile.Write(filepath.Join(dir, FileName), append(data, '\n'), 0o644)
}

// Read loads dir/stack.json.
func Read(dir string) (*Stack, error) {
	data, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		return nil, fmt.Errorf("read %s (is meshctl up running?): %w", FileName, err)
	}
	var s Stack
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", FileName, err)
	}
	return &s, nil
}
