// Package kubeapi is the local stack's stand-in for the one part of the Kubernetes
// API server the signer reads: pods, to check that a trusted node agent asks for
// the identity of a workload on its own node (CA_TRUSTED_NODE_ACCOUNTS). It answers
// exactly the two reads the signer makes, with the API server's shapes and status
// codes — get a pod (GET /api/v1/namespaces/{ns}/pods/{name}) and list a
// namespace's pods on a node (GET /api/v1/namespaces/{ns}/pods?fieldSelector=
// spec.nodeName=N) — over HTTPS, for a bearer token, and refuses everything else. The
// pods are the ones meshctl up runs (Add), all on one node.
package kubeapi

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/meshagent/meshagent/pkg/kubeobj"
)

// Pod is a pod as far as the signer asks: where it runs and as whom.
type Pod struct {
	Namespace, Name, ServiceAccount, Node string
}

// Server answers pod reads for token.
type Server struct {
	token string
	mu    sync.Mutex
	pods  []Pod
}

// New returns a server that answers only requests bearing token.
func New(token string) *Server { return &Server{token: token} }

// Add makes p known (a pod started), replacing a pod of the same name.
func (s *Server) Add(p Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.pods {
		if s.pods[i].Namespace == p.Namespace && s.pods[i].Name == p.Name {
			s.pods[i] = p
			return
		}
	}
	s.pods = append(s.pods, p)
}

// toAPI is p in the API server's JSON.
func toAPI(p Pod) kubeobj.Pod {
	return kubeobj.Pod{
		Metadata: kubeobj.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		Spec:     kubeobj.PodSpec{NodeName: p.Node, ServiceAccountName: p.ServiceAccount},
		Status:   kubeobj.PodStatus{Phase: "Running"}, // the stack's pods run while it does
	}
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(auth), []byte(s.token)) != 1 {
		status(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	if r.Method != http.MethodGet {
		status(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "only pods may be read here")
		return
	}
	// /api/v1/namespaces/{ns}/pods[/{name}]
	parts := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	if len(parts) < 5 || len(parts) > 6 || parts[0] != "api" || parts[1] != "v1" || parts[2] != "namespaces" || parts[4] != "pods" {
		status(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	ns, err := url.PathUnescape(parts[3])
	if err != nil {
		status(w, http.StatusBadRequest, "BadRequest", "namespace: "+err.Error())
		return
	}
	s.mu.Lock()
	pods := append([]Pod(nil), s.pods...)
	s.mu.Unlock()
	if len(parts) == 6 {
		name, err := url.PathUnescape(parts[5])
		if err != nil {
			status(w, http.StatusBadRequest, "BadRequest", "name: "+err.Error())
			return
		}
		for _, p := range pods {
			if p.Namespace == ns && p.Name == name {
				a := toAPI(p)
				a.Kind = "Pod"
				writeJSON(w, http.StatusOK, a)
				return
			}
		}
		status(w, http.StatusNotFound, "NotFound", `pods "`+name+`" not found`)
		return
	}
	node, ok := "", true
	if sel := r.URL.Query().Get("fieldSelector"); sel != "" {
		node, ok = strings.CutPrefix(sel, "spec.nodeName=")
	}
	if !ok || strings.ContainsAny(node, ",!") {
		status(w, http.StatusBadRequest, "BadRequest", "only the field selector spec.nodeName=<node> is served here")
		return
	}
	items := []kubeobj.Pod{}
	for _, p := range pods {
		if p.Namespace == ns && (node == "" || p.Node == node) {
			items = append(items, toAPI(p))
		}
	}
	writeJSON(w, http.StatusOK, kubeobj.PodList{Kind: "PodList", APIVersion: "v1", Items: items})
}

// status writes a metav1.Status, as the API server answers an error.
func status(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"message": msg, "reason": reason, "code": code})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
