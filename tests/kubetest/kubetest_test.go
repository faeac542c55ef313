//go:build kube

package kubetest_test

import (
	"net/http"
	"testing"

	"github.com/meshagent/meshagent/tests/kubetest"
)

// The API server the helper starts enforces Pod Security "restricted", issues
// pod-bound tokens through TokenRequest, reviews them, and authorizes by RBAC.
func TestKubeServerIsARealAPIServer(t *testing.T) {
	s := kubetest.Start(t)
	a := s.Admin
	a.Namespace(t, "shop", map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	a.ServiceAccount(t, "shop", "web")
	uid := a.Pod(t, "shop", "web-1", "web", "node-a")

	// A pod that may run as root is refused by Pod Security admission, and not stored.
	priv := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "root"},
		"spec": map[string]any{"serviceAccountName": "web", "containers": []any{map[string]any{"name": "c", "image": "x"}}}}
	a.Call(t, http.MethodPost, "/api/v1/namespaces/shop/pods", priv, nil, http.StatusForbidden)
	a.Call(t, http.MethodGet, "/api/v1/namespaces/shop/pods/root", nil, nil, http.StatusNotFound)

	tok := a.RequestToken(t, "shop", "web", "istio-ca", "web-1", uid, 600)
	var tr struct {
		Status struct {
			Authenticated bool `json:"authenticated"`
			User          struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"user"`
		} `json:"status"`
	}
	a.Call(t, http.MethodPost, "/apis/authentication.k8s.io/v1/tokenreviews", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
		"spec": map[string]any{"token": tok, "audiences": []string{"istio-ca"}},
	}, &tr)
	if !tr.Status.Authenticated || tr.Status.User.Username != "system:serviceaccount:shop:web" ||
		len(tr.Status.User.Extra["authentication.kubernetes.io/pod-name"]) != 1 || tr.Status.User.Extra["authentication.kubernetes.io/pod-name"][0] != "web-1" {
		t.Fatalf("TokenReview of a pod-bound token: %+v", tr.Status)
	}

	// The service account's own token gets nothing RBAC does not grant.
	web := s.Client(a.RequestToken(t, "shop", "web", s.URL, "", "", 600))
	web.Call(t, http.MethodGet, "/api/v1/namespaces/shop/secrets", nil, nil, http.StatusForbidden)
	user, groups := kubetest.ServiceAccountUser("shop", "web")
	if a.Can(t, user, groups, "list", "", "secrets", "", "shop", "") {
		t.Fatal("SubjectAccessReview: shop/web may list secrets")
	}
	if !a.Can(t, "admin", []string{"system:masters"}, "list", "", "secrets", "", "shop", "") {
		t.Fatal("SubjectAccessReview: admin may not list secrets")
	}
}
