package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// Client speaks to the API server in plain HTTPS and JSON (the workspace has no
// client-go), as one user.
type Client struct {
	URL   string
	Token string
	HTTP  *http.Client
}

// Do sends one request (body: nil, or bytes sent with contentType) and returns the
// status and the body.
func (c *Client) Do(ctx context.Context, method, path string, body []byte, contentType string) (int, []byte, error) {
	code, _, raw, err := c.do(ctx, method, path, body, contentType)
	return code, raw, err
}

// do is Do that returns the answer's headers too.
func (c *Client) do(ctx context.Context, method, path string, body []byte, contentType string) (int, http.Header, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.URL, "/")+path, r)
	if err != nil {
		return 0, nil, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, resp.Header, raw, err
}

// Call sends obj (nil: no body) as JSON and decodes the answer into out (nil: not
// decoded), failing t unless the status is one of ok (none given: any 2xx).
// It returns the status.
func (c *Client) Call(t testing.TB, method, path string, obj, out any, ok ...int) int {
	t.Helper()
	var body []byte
	if obj != nil {
		var err error
		if body, err = json.Marshal(obj); err != nil {
			t.Fatal(err)
		}
	}
	code, raw, err := c.Do(context.Background(), method, path, body, "application/json")
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	good := code/100 == 2
	if len(ok) > 0 {
		good = false
		for _, o := range ok {
			good = good || code == o
		}
	}
	if !good {
		t.Fatalf("%s %s: %d %s", method, path, code, raw)
	}
	if out != nil && code/100 == 2 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: decode %T: %v", method, path, out, err)
		}
	}
	return code
}

// Create posts obj to the collection at path.
func (c *Client) Create(t testing.TB, path string, obj any) map[string]any {
	t.Helper()
	var out map[string]any
	c.Call(t, http.MethodPost, path, obj, &out, http.StatusCreated, http.StatusOK)
	return out
}

// Apply applies one object (YAML or JSON) server-side (not a dry run) as
// fieldManager, forcing conflicts, at the object's own path. It returns the API
// server's warnings (such as Pod Security's "would violate" for a workload's pod
// template) and its error, if any.
func (c *Client) Apply(ctx context.Context, objPath string, obj []byte, fieldManager string) ([]string, error) {
	q := url.Values{"fieldManager": {fieldManager}, "force": {"true"}}
	code, h, raw, err := c.do(ctx, http.MethodPatch, objPath+"?"+q.Encode(), obj, "application/apply-patch+yaml")
	if err != nil {
		return nil, err
	}
	warnings := h.Values("Warning")
	if code/100 != 2 {
		return warnings, fmt.Errorf("apply %s: %d %s", objPath, code, raw)
	}
	return warnings, nil
}

// Meta is the part of an object every test needs.
type Meta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace,omitempty"`
	UID             string            `json:"uid,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
}

// Namespace creates a namespace with labels (Pod Security's
// pod-security.kubernetes.io/enforce and the like) and, as the controller manager
// would, its default service account.
func (c *Client) Namespace(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	c.Create(t, "/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": Meta{Name: name, Labels: labels}})
	c.ServiceAccount(t, name, "default")
}

// ServiceAccount creates a service account (there is no controller manager to make
// a namespace's default one).
func (c *Client) ServiceAccount(t testing.TB, ns, name string) {
	t.Helper()
	c.Create(t, "/api/v1/namespaces/"+ns+"/serviceaccounts", map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": Meta{Name: name}})
}

// Pod creates a pod of service account sa already bound to node (there is no
// scheduler, and no kubelet: it never runs) and returns its uid.
func (c *Client) Pod(t testing.TB, ns, name, sa, node string) string {
	t.Helper()
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": Meta{Name: name},
		"spec": map[string]any{
			"serviceAccountName": sa, "nodeName": node,
			"automountServiceAccountToken": false,
			"securityContext":              map[string]any{"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": map[string]any{"type": "RuntimeDefault"}},
			"containers": []any{map[string]any{
				"name": "app", "image": "registry.invalid/app:1",
				"securityContext": map[string]any{"allowPrivilegeEscalation": false, "capabilities": map[string]any{"drop": []string{"ALL"}}},
			}},
		},
	}
	out := c.Create(t, "/api/v1/namespaces/"+ns+"/pods", pod)
	uid, _ := out["metadata"].(map[string]any)["uid"].(string)
	if uid == "" {
		t.Fatalf("pod %s/%s created without a uid: %v", ns, name, out)
	}
	return uid
}

// DeletePod deletes a pod at once (grace period 0: there is no kubelet to confirm
// a graceful stop).
func (c *Client) DeletePod(t testing.TB, ns, name string) {
	t.Helper()
	c.Call(t, http.MethodDelete, "/api/v1/namespaces/"+ns+"/pods/"+name, map[string]any{"gracePeriodSeconds": 0}, nil)
}

// RequestToken asks the TokenRequest API for a token of service account ns/sa with
// audience, bound to pod (name and uid; "" for an unbound token), valid for
// seconds.
func (c *Client) RequestToken(t testing.TB, ns, sa, audience, pod, podUID string, seconds int) string {
	t.Helper()
	spec := map[string]any{"audiences": []string{audience}, "expirationSeconds": seconds}
	if pod != "" {
		spec["boundObjectRef"] = map[string]any{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": podUID}
	}
	var out struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	c.Call(t, http.MethodPost, "/api/v1/namespaces/"+ns+"/serviceaccounts/"+sa+"/token",
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}, &out)
	if out.Status.Token == "" {
		t.Fatalf("TokenRequest for %s/%s gave no token", ns, sa)
	}
	return out.Status.Token
}

// Can asks the API server (SubjectAccessReview, as admin) whether user in groups
// may verb the resource (group "" for the core group) in ns ("" for cluster-wide),
// optionally a subresource or a named object.
func (c *Client) Can(t testing.TB, user string, groups []string, verb, group, resource, subresource, ns, name string) bool {
	t.Helper()
	attrs := map[string]any{"verb": verb, "group": group, "resource": resource}
	if subresource != "" {
		attrs["subresource"] = subresource
	}
	if ns != "" {
		attrs["namespace"] = ns
	}
	if name != "" {
		attrs["name"] = name
	}
	var out struct {
		Status struct {
			Allowed bool   `json:"allowed"`
			Reason  string `json:"reason"`
		} `json:"status"`
	}
	c.Call(t, http.MethodPost, "/apis/authorization.k8s.io/v1/subjectaccessreviews", map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
		"spec": map[string]any{"user": user, "groups": groups, "resourceAttributes": attrs},
	}, &out, http.StatusCreated, http.StatusOK)
	return out.Status.Allowed
}

// ServiceAccountUser is the user name and groups the API server gives a service
// account's token.
func ServiceAccountUser(ns, sa string) (string, []string) {
	return "system:serviceaccount:" + ns + ":" + sa, []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
}

// ObjectRef names an object of a manifest.
type ObjectRef struct {
	APIVersion, Kind, Namespace, Name string
}

func (r ObjectRef) String() string {
	if r.Namespace == "" {
		return r.Kind + "/" + r.Name
	}
	return r.Kind + "/" + r.Namespace + "/" + r.Name
}

// RefOf reads apiVersion, kind and metadata's name and namespace of one YAML
// document in the block style kubectl and kustomize write (top-level keys at the
// left margin, metadata's fields indented by two spaces). It does not parse YAML
// in general: the API server does, when the document is applied.
func RefOf(doc []byte) (ObjectRef, error) {
	var r ObjectRef
	inMeta := false
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimRight(line, " \r")
		if line == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if line[0] != ' ' {
			inMeta = line == "metadata:"
			if v, ok := strings.CutPrefix(line, "apiVersion: "); ok {
				r.APIVersion = unquote(v)
			}
			if v, ok := strings.CutPrefix(line, "kind: "); ok {
				r.Kind = unquote(v)
			}
			continue
		}
		if !inMeta || strings.HasPrefix(line, "   ") {
			continue
		}
		if v, ok := strings.CutPrefix(line, "  name: "); ok {
			r.Name = unquote(v)
		}
		if v, ok := strings.CutPrefix(line, "  namespace: "); ok {
			r.Namespace = unquote(v)
		}
	}
	if r.APIVersion == "" || r.Kind == "" || r.Name == "" {
		return r, fmt.Errorf("document without apiVersion, kind or metadata.name (%+v)", r)
	}
	return r, nil
}

func unquote(s string) string { return strings.Trim(strings.TrimSpace(s), `"'`) }

// resource is one entry of the API server's discovery (an APIResourceList).
type resource struct {
	Name       string `json:"name"`
	Kind       string `json:"kind"`
	Namespaced bool   `json:"namespaced"`
}

// PathOf is the REST path of the object r names, from the API server's discovery.
func (c *Client) PathOf(ctx context.Context, r ObjectRef) (string, error) {
	base := "/apis/" + r.APIVersion
	if !strings.Contains(r.APIVersion, "/") {
		base = "/api/" + r.APIVersion
	}
	code, raw, err := c.Do(ctx, http.MethodGet, base, nil, "")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("discovery of %s: %d %s", r.APIVersion, code, raw)
	}
	var list struct {
		Resources []resource `json:"resources"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("discovery of %s: %w", r.APIVersion, err)
	}
	for _, res := range list.Resources {
		if res.Kind != r.Kind || strings.Contains(res.Name, "/") {
			continue
		}
		if !res.Namespaced {
			return base + "/" + res.Name + "/" + url.PathEscape(r.Name), nil
		}
		if r.Namespace == "" {
			return "", fmt.Errorf("%s: namespaced, but the document names no namespace", r)
		}
		return base + "/namespaces/" + url.PathEscape(r.Namespace) + "/" + res.Name + "/" + url.PathEscape(r.Name), nil
	}
	return "", fmt.Errorf("%s: the API server serves no kind %s in %s", r, r.Kind, r.APIVersion)
}

// ApplyYAML applies one YAML document server-side (RefOf says what it is; a
// namespaced object without a namespace goes into ns) and returns what it applied
// and the API server's warnings.
func (c *Client) ApplyYAML(ctx context.Context, doc []byte, fieldManager, ns string) (ObjectRef, []string, error) {
	r, err := RefOf(doc)
	if err != nil {
		return r, nil, err
	}
	if r.Namespace == "" {
		r.Namespace = ns
	}
	path, err := c.PathOf(ctx, r)
	if err != nil {
		return r, nil, err
	}
	w, err := c.Apply(ctx, path, doc, fieldManager)
	return r, w, err
}

// CanURL asks the API server (SubjectAccessReview, as admin) whether user in
// groups may verb the non-resource path (/.well-known/openid-configuration).
func (c *Client) CanURL(t testing.TB, user string, groups []string, verb, path string) bool {
	t.Helper()
	var out struct {
		Status struct {
			Allowed bool `json:"allowed"`
		} `json:"status"`
	}
	c.Call(t, http.MethodPost, "/apis/authorization.k8s.io/v1/subjectaccessreviews", map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
		"spec": map[string]any{"user": user, "groups": groups, "nonResourceAttributes": map[string]any{"verb": verb, "path": path}},
	}, &out, http.StatusCreated, http.StatusOK)
	return out.Status.Allowed
}
