//go:build kube

package kubernetes_test

// The manifests against a real API server (tests/kubetest, make test-kube): every
// kustomize overlay applied server-side, not as a dry run, into meshagent-system,
// which enforces Pod Security "restricted"; a Pod made from every workload's pod
// template created there (Pod Security admission judges Pods, and with no
// controller manager no Deployment ever makes one); the injector's output for a
// sample Deployment in a restricted namespace; and each component's RBAC checked
// with SubjectAccessReviews: what it may and what it may not do.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/deploy/kubernetes"
	"github.com/meshagent/meshagent/deploy/kubernetes/inject"
	"github.com/meshagent/meshagent/tests/kubetest"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// applyAll applies every document of a kustomize build and returns the objects
// applied and every warning the API server gave.
func applyAll(t *testing.T, k *kubetest.Server, out []byte, ns string) ([]kubetest.ObjectRef, []string) {
	t.Helper()
	var refs []kubetest.ObjectRef
	var warnings []string
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		ref, w, err := k.Admin.ApplyYAML(context.Background(), []byte(doc), "meshagent-kube-test", ns)
		if err != nil {
			t.Fatalf("server-side apply refused: %v", err)
		}
		refs = append(refs, ref)
		for _, x := range w {
			warnings = append(warnings, ref.String()+": "+x)
		}
	}
	return refs, warnings
}

// podFromTemplate creates a Pod of a workload's pod template, named after it, as
// its controller would (a StatefulSet's claim templates become the claims of its
// first replica), and fails t if the API server refuses it.
func podFromTemplate(t *testing.T, k *kubetest.Server, ns string, w *workload, claims []string) {
	t.Helper()
	spec := w.spec.DeepCopy()
	for _, c := range claims {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c + "-" + w.name + "-0"}}})
	}
	pod := corev1.Pod{Spec: *spec}
	pod.APIVersion, pod.Kind = "v1", "Pod"
	pod.Name, pod.Labels = "template-"+strings.ToLower(w.kind)+"-"+w.name, map[string]string{"test": "pod-template"}
	body, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	code, raw, err := k.Admin.Do(context.Background(), http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", body, "application/json")
	if err != nil || code != http.StatusCreated {
		t.Errorf("a Pod of %s %s's template refused in %s: %d %s %v", w.kind, w.name, ns, code, raw, err)
	}
}

// Every overlay is accepted by a real API server, its workloads meet Pod Security
// "restricted" (no warning on apply, and a Pod of each template admitted), and
// the fleet's RBAC grants exactly what the services need.
func TestKubeOverlaysApplyToARealAPIServer(t *testing.T) {
	for _, dir := range []string{"base", "external-nats", "token-review"} {
		t.Run(dir, func(t *testing.T) {
			k := kubetest.Start(t)
			out := build(t, dir)
			refs, warnings := applyAll(t, k, out, "")
			if len(refs) == 0 {
				t.Fatal("nothing applied")
			}
			for _, w := range warnings {
				t.Errorf("warning: %s", w)
			}
			// Every object is there, as applied.
			for _, r := range refs {
				path, err := k.Admin.PathOf(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				k.Admin.Call(t, http.MethodGet, path, nil, nil, http.StatusOK)
			}
			var ns struct {
				Metadata kubetest.Meta `json:"metadata"`
			}
			k.Admin.Call(t, http.MethodGet, "/api/v1/namespaces/meshagent-system", nil, &ns)
			if ns.Metadata.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
				t.Fatalf("meshagent-system labels %v", ns.Metadata.Labels)
			}

			inv, err := decodeAll(out)
			if err != nil {
				t.Fatal(err)
			}
			// The namespace's default service account, as the controller manager
			// would make it (the nats pods run as it).
			k.Admin.Call(t, http.MethodPost, "/api/v1/namespaces/meshagent-system/serviceaccounts",
				map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"}}, nil, http.StatusCreated, http.StatusConflict)
			for _, w := range inv.workloads {
				var claims []string
				if w.kind == "StatefulSet" {
					claims = statefulSetClaims(t, out, w.name)
				}
				podFromTemplate(t, k, w.namespace, w, claims)
			}
			// Pod Security is enforced there: a pod running as root is refused.
			root := corev1.Pod{Spec: corev1.PodSpec{ServiceAccountName: "signer", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
			root.APIVersion, root.Kind, root.Name = "v1", "Pod", "as-root"
			k.Admin.Call(t, http.MethodPost, "/api/v1/namespaces/meshagent-system/pods", root, nil, http.StatusForbidden)

			checkRBAC(t, k, dir)
		})
	}
}

// statefulSetClaims names the volumeClaimTemplates of StatefulSet name in out.
func statefulSetClaims(t *testing.T, out []byte, name string) []string {
	t.Helper()
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var s struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				VolumeClaimTemplates []struct {
					Metadata struct {
						Name string `json:"name"`
					} `json:"metadata"`
				} `json:"volumeClaimTemplates"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &s); err != nil || s.Kind != "StatefulSet" || s.Metadata.Name != name {
			continue
		}
		var claims []string
		for _, c := range s.Spec.VolumeClaimTemplates {
			claims = append(claims, c.Metadata.Name)
		}
		return claims
	}
	return nil
}

// checkRBAC asks the API server what each component's service account may do.
func checkRBAC(t *testing.T, k *kubetest.Server, dir string) {
	t.Helper()
	a := k.Admin
	type check struct {
		verb, group, resource, sub, ns, name string
		allowed                              bool
	}
	const root = "istio-ca-root-cert"
	signer := []check{
		// The root ConfigMap publisher (base/signer-rbac.yaml).
		{"list", "", "namespaces", "", "", "", true},
		{"watch", "", "namespaces", "", "", "", true},
		{"get", "", "configmaps", "", "shop", root, true},
		{"list", "", "configmaps", "", "", root, true},
		{"watch", "", "configmaps", "", "", root, true},
		{"patch", "", "configmaps", "", "shop", root, true},
		{"patch", "", "configmaps", "", "kube-system", root, true},
		// ... and nothing else of ConfigMaps, namespaces or the rest.
		{"get", "", "configmaps", "", "shop", "app-config", false},
		{"patch", "", "configmaps", "", "kube-system", "kube-root-ca.crt", false},
		{"list", "", "configmaps", "", "", "", false},
		{"delete", "", "configmaps", "", "shop", root, false},
		{"create", "", "configmaps", "", "shop", "", true}, // RBAC cannot name what is created
		{"update", "", "namespaces", "", "", "shop", false},
		{"delete", "", "namespaces", "", "", "shop", false},
		{"get", "", "secrets", "", "meshagent-system", "meshagent-ca-kek", false},
		{"list", "", "secrets", "", "", "", false},
		{"create", "", "pods", "", "shop", "", false},
		{"create", "", "serviceaccounts", "token", "shop", "web", false},
		{"create", "", "pods", "exec", "meshagent-system", "nats-0", false},
		{"create", "authentication.k8s.io", "tokenreviews", "", "", "", dir == "token-review"},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", "", "", dir == "token-review"},
		// Impersonation (CA_TRUSTED_NODE_ACCOUNTS) is not configured by any overlay.
		{"list", "", "pods", "", "shop", "", false},
	}
	none := []check{ // rotator, operator, nats: no Kubernetes API at all
		{"list", "", "namespaces", "", "", "", false},
		{"get", "", "configmaps", "", "shop", root, false},
		{"patch", "", "configmaps", "", "shop", root, false},
		{"get", "", "secrets", "", "meshagent-system", "meshagent-ca-kek", false},
		{"list", "", "pods", "", "", "", false},
		{"create", "authentication.k8s.io", "tokenreviews", "", "", "", false},
		{"create", "", "serviceaccounts", "token", "meshagent-system", "signer", false},
	}
	// The node agent verifies its pods' tokens offline (discovery, below) and is
	// admitted by its projected token: it needs no Kubernetes API either.
	accounts := map[string][]check{"signer": signer, "rotator": none, "operator": none, "default": none, "meshagent-node": none}
	for sa, checks := range accounts {
		user, groups := kubetest.ServiceAccountUser("meshagent-system", sa)
		for _, c := range checks {
			if got := a.Can(t, user, groups, c.verb, c.group, c.resource, c.sub, c.ns, c.name); got != c.allowed {
				t.Errorf("%s: %s %s/%s/%s %s/%s: allowed %v, want %v", sa, c.verb, c.group, c.resource, c.sub, c.ns, c.name, got, c.allowed)
			}
		}
	}
	// Discovery of the service-account issuer (TOKEN_ISSUER_DISCOVERY): the default
	// binding system:service-account-issuer-discovery lets every service account.
	for _, sa := range []string{"signer", "meshagent-node"} {
		user, groups := kubetest.ServiceAccountUser("meshagent-system", sa)
		for _, p := range []string{"/.well-known/openid-configuration", "/openid/v1/jwks"} {
			if !a.CanURL(t, user, groups, "get", p) {
				t.Errorf("%s may not get %s", sa, p)
			}
		}
	}
	// A workload in the mesh may not read the CA's secrets nor write its roots.
	user, groups := kubetest.ServiceAccountUser("shop", "web")
	if a.Can(t, user, groups, "patch", "", "configmaps", "", "shop", root) || a.Can(t, user, groups, "get", "", "secrets", "", "meshagent-system", "meshagent-ca-kek") {
		t.Error("shop/web may write the root ConfigMap or read the CA's key")
	}
}

// restrictedDeployment is a workload whose own containers meet Pod Security
// "restricted": a refusal of the injected Deployment is the sidecars' fault.
const restrictedDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      serviceAccountName: web
      securityContext:
        runAsNonRoot: true
        runAsUser: 1000
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: web
          image: example/web:1
          ports: [{name: http, containerPort: 8080}]
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: {drop: ["ALL"]}
`

// The injector's output, direct and on the node tier, is accepted in a namespace
// enforcing "restricted", with no Pod Security warning, and a Pod of its template
// is admitted.
func TestKubeInjectedDeploymentIsAdmitted(t *testing.T) {
	direct := inject.DefaultValues()
	node := direct
	node.Bus = inject.BusNode
	for _, tt := range []struct {
		name string
		v    inject.Values
	}{{"direct", direct}, {"node tier", node}} {
		t.Run(tt.name, func(t *testing.T) { injectedDeploymentIsAdmitted(t, tt.v) })
	}
}

func injectedDeploymentIsAdmitted(t *testing.T, v inject.Values) {
	k := kubetest.Start(t)
	k.Admin.Namespace(t, "shop", map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"})
	k.Admin.ServiceAccount(t, "shop", "web")
	out, err := inject.Inject(kubernetes.SidecarTemplate, []byte(restrictedDeployment), v)
	if err != nil {
		t.Fatal(err)
	}
	refs, warnings := applyAll(t, k, out, "shop")
	if len(refs) != 1 || refs[0].Kind != "Deployment" {
		t.Fatalf("applied %v", refs)
	}
	for _, w := range warnings {
		t.Errorf("warning: %s", w)
	}
	inv, err := decodeAll(out)
	if err != nil || len(inv.workloads) != 1 {
		t.Fatalf("%v, %d workloads", err, len(inv.workloads))
	}
	w := inv.workloads[0]
	if len(w.spec.InitContainers) < 3 {
		t.Fatalf("not injected: %d init containers", len(w.spec.InitContainers))
	}
	podFromTemplate(t, k, "shop", w, nil)
	// The same template with a sidecar made privileged is refused: the namespace
	// does enforce what the test claims the sidecars meet.
	bad := w.spec.DeepCopy()
	bad.InitContainers[0].SecurityContext.AllowPrivilegeEscalation = nil
	pod := corev1.Pod{Spec: *bad}
	pod.APIVersion, pod.Kind, pod.Name = "v1", "Pod", "escalating"
	k.Admin.Call(t, http.MethodPost, "/api/v1/namespaces/shop/pods", pod, nil, http.StatusForbidden)
}

// kubectl's own kustomize (5.5 in kubectl 1.32, which crashed on a patch file of
// several deletions) builds every overlay into the objects the tests apply.
func TestKubeKubectlKustomizeBuildsEveryOverlay(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("no kubectl in PATH")
	}
	for _, dir := range []string{"base", "external-nats", "token-review"} {
		out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v\n%.2000s", dir, err, out)
		}
		if got, want := refsOf(t, out), refsOf(t, build(t, dir)); !slices.Equal(got, want) {
			t.Errorf("%s: kubectl kustomize builds %v, the kustomize library %v", dir, got, want)
		}
	}
}

func refsOf(t *testing.T, out []byte) []string {
	t.Helper()
	var refs []string
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		r, err := kubetest.RefOf([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r.String())
	}
	slices.Sort(refs)
	return refs
}

// The node tier rests on a claim Kubernetes puts in a pod-bound token: the node
// the pod runs on (kubernetes.io.node.name). A token for the node agent's account,
// with its DaemonSet's audience and bound to a Pod of its template on a node, as
// the kubelet requests it for the projected volume, names that node; the node's
// admission on the hub and its pods' on the node agent both read it.
func TestKubeNodeAgentTokenNamesItsNode(t *testing.T) {
	k := kubetest.Start(t)
	out := build(t, "base")
	applyAll(t, k, out, "")
	inv, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	var agent *workload
	for _, w := range inv.workloads {
		if w.kind == "DaemonSet" && w.name == "node-agent" {
			agent = w
		}
	}
	if agent == nil {
		t.Fatal("no node-agent DaemonSet in base")
	}
	var audience string
	for _, v := range agent.spec.Volumes {
		if v.Projected != nil && len(v.Projected.Sources) == 1 && v.Projected.Sources[0].ServiceAccountToken != nil {
			audience = v.Projected.Sources[0].ServiceAccountToken.Audience
		}
	}
	k.Admin.Call(t, http.MethodPost, "/api/v1/nodes",
		map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "node-a.example"}}, nil, http.StatusCreated)
	spec := agent.spec.DeepCopy()
	spec.NodeName = "node-a.example"
	pod := corev1.Pod{Spec: *spec}
	pod.APIVersion, pod.Kind, pod.Name = "v1", "Pod", "node-agent-x"
	var created struct {
		Metadata kubetest.Meta `json:"metadata"`
	}
	k.Admin.Call(t, http.MethodPost, "/api/v1/namespaces/meshagent-system/pods", pod, &created, http.StatusCreated)
	tok := k.Admin.RequestToken(t, "meshagent-system", agent.spec.ServiceAccountName, audience, pod.Name, created.Metadata.UID, 3600)
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q", tok)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Aud []string `json:"aud"`
		K8s struct {
			Pod  struct{ Name string }  `json:"pod"`
			Node *struct{ Name string } `json:"node"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	if claims.K8s.Node == nil || claims.K8s.Node.Name != "node-a.example" || claims.K8s.Pod.Name != pod.Name || !slices.Contains(claims.Aud, audience) {
		t.Fatalf("token claims %s: want pod %s on node node-a.example for %s", payload, pod.Name, audience)
	}
}
