package authn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/meshagent/meshagent/pkg/kubeobj"
	"github.com/meshagent/meshagent/pkg/pki"
)

// ErrPermissionDenied wraps a refusal of an authenticated caller: it may not have
// what it asked for (another workload's identity).
var ErrPermissionDenied = errors.New("permission denied")

func deny(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrPermissionDenied, fmt.Sprintf(format, a...))
}

const maxPodsBody = 8 << 20

// ParseTrustedAccounts reads Istio's CA_TRUSTED_NODE_ACCOUNTS: comma-separated
// <namespace>/<serviceaccount> pairs.
func ParseTrustedAccounts(s string) ([]string, error) {
	var out, bad []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		ns, sa, ok := strings.Cut(f, "/")
		if !ok || ns == "" || sa == "" || strings.Contains(sa, "/") {
			bad = append(bad, f)
			continue
		}
		out = append(out, f)
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("want <namespace>/<serviceaccount>, comma-separated; got %q", bad)
	}
	return out, nil
}

// NodeAuthorizer lets a trusted node agent (Istio's CA_TRUSTED_NODE_ACCOUNTS, e.g.
// ztunnel) ask for the identity of a workload on its own node (Istio's
// ImpersonatedIdentity), as istiod's NodeAuthorizer does: the agent's pod-bound
// token names its pod; the API server says which node that pod runs on, and
// whether a pod of the target service account runs there too.
type NodeAuthorizer struct {
	URL         string // API server, https://host:port
	Client      *http.Client
	BearerFile  string   // the signer's own token (needs get/list pods)
	Trusted     []string // <ns>/<sa> of the node agents
	TrustDomain string
}

// Authorize returns caller re-targeted at target (a SPIFFE ID), or why not.
func (n *NodeAuthorizer) Authorize(ctx context.Context, caller Caller, target string) (Caller, error) {
	td, tns, tsa, err := pki.ParseWorkloadID(target)
	if err != nil {
		return Caller{}, deny("impersonated identity: %v", err)
	}
	if td != n.TrustDomain {
		return Caller{}, deny("impersonated identity %q is not in trust domain %q", target, n.TrustDomain)
	}
	_, cns, csa, err := pki.ParseWorkloadID(caller.ID.String())
	if err != nil {
		return Caller{}, deny("caller: %v", err)
	}
	if !slices.Contains(n.Trusted, cns+"/"+csa) {
		return Caller{}, deny("%s may not impersonate: it is not a trusted node account (CA_TRUSTED_NODE_ACCOUNTS)", caller.ID)
	}
	if caller.Pod.IsZero() {
		return Caller{}, deny("%s may impersonate only with a pod-bound token: its credential names no pod, so its node is unknown", caller.ID)
	}
	var self kubeobj.Pod
	if err := n.get(ctx, "/api/v1/namespaces/"+url.PathEscape(caller.Pod.Namespace)+"/pods/"+url.PathEscape(caller.Pod.Name), &self); err != nil {
		return Caller{}, err
	}
	node := self.Spec.NodeName
	if node == "" {
		return Caller{}, deny("node agent pod %s is not scheduled on a node", caller.Pod)
	}
	var list kubeobj.PodList
	q := url.Values{"fieldSelector": {"spec.nodeName=" + node}}
	if err := n.get(ctx, "/api/v1/namespaces/"+url.PathEscape(tns)+"/pods?"+q.Encode(), &list); err != nil {
		return Caller{}, err
	}
	for _, p := range list.Items {
		if p.Spec.NodeName == node && p.Spec.ServiceAccountName == tsa && p.Status.Phase != "Succeeded" && p.Status.Phase != "Failed" {
			id, _ := pki.WorkloadID(td, tns, tsa)
			return Caller{ID: id.URL(), Source: caller.Source, Expires: caller.Expires}, nil
		}
	}
	return Caller{}, deny("no running pod of service account %s/%s on node %q, where %s runs", tns, tsa, node, caller.ID)
}

// get reads one API object. A failure to get an answer is ErrUnavailable.
func (n *NodeAuthorizer) get(ctx context.Context, path string, out any) error {
	unavailable := func(format string, a ...any) error {
		return fmt.Errorf("%w: node authorization at %s: %s", ErrUnavailable, n.URL, fmt.Sprintf(format, a...))
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(n.URL, "/")+path, nil)
	if err != nil {
		return unavailable("%v", err)
	}
	code, st, raw, err := callAPI(n.Client, n.BearerFile, req, maxPodsBody)
	switch {
	case err != nil:
		return unavailable("%v", err)
	case code == http.StatusNotFound:
		return deny("%s: not found", path)
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return unavailable("%s: the signer's service account may not get and list pods", st)
	case code != http.StatusOK:
		return unavailable("%s", st)
	case len(raw) > maxPodsBody:
		return unavailable("answer larger than %d bytes", maxPodsBody)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return unavailable("answer is not a pod or pod list: %v", err)
	}
	return nil
}
