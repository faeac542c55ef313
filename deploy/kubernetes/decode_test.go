package kubernetes_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshagent/meshagent/deploy/kubernetes/internal/strict"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// workload is a pod template and where it comes from.
type workload struct {
	kind, name, namespace string
	replicas              int32
	labels                map[string]string
	spec                  corev1.PodSpec
}

// inventory is a set of manifests, decoded.
type inventory struct {
	workloads  []*workload
	configMaps map[string]*corev1.ConfigMap
	services   []*corev1.Service
	pdbs       []*policyv1.PodDisruptionBudget
	namespaces map[string]*corev1.Namespace
	bindings   []*rbacv1.ClusterRoleBinding
	policies   []*networkingv1.NetworkPolicy
	// serviceAccounts are the names of the ServiceAccounts in the set.
	serviceAccounts map[string]bool
	kinds           map[string]int
}

// decodeAll strictly decodes a multi-document YAML stream into the Kubernetes API
// types: an unknown field, a duplicate field or an unknown kind is an error.
func decodeAll(data []byte) (*inventory, error) {
	inv := &inventory{configMaps: map[string]*corev1.ConfigMap{}, namespaces: map[string]*corev1.Namespace{}, serviceAccounts: map[string]bool{}, kinds: map[string]int{}}
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if err := inv.decode(doc); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
	}
	return inv, nil
}

func (inv *inventory) decode(doc []byte) error {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	strict := func(v any) error {
		if err := strict.Unmarshal(doc, v); err != nil {
			return fmt.Errorf("%s: %w", tm.Kind, err)
		}
		return nil
	}
	want := map[string]string{
		"Namespace": "v1", "ConfigMap": "v1", "Service": "v1", "ServiceAccount": "v1",
		"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1", "PodDisruptionBudget": "policy/v1",
		"ClusterRole": "rbac.authorization.k8s.io/v1", "ClusterRoleBinding": "rbac.authorization.k8s.io/v1", "NetworkPolicy": "networking.k8s.io/v1",
	}
	if v, ok := want[tm.Kind]; !ok {
		return fmt.Errorf("kind %q: not one the manifests are meant to hold", tm.Kind)
	} else if v != tm.APIVersion {
		return fmt.Errorf("%s: apiVersion %q, want %q", tm.Kind, tm.APIVersion, v)
	}
	inv.kinds[tm.Kind]++
	switch tm.Kind {
	case "Namespace":
		var ns corev1.Namespace
		if err := strict(&ns); err != nil {
			return err
		}
		inv.namespaces[ns.Name] = &ns
	case "ClusterRoleBinding":
		var b rbacv1.ClusterRoleBinding
		if err := strict(&b); err != nil {
			return err
		}
		inv.bindings = append(inv.bindings, &b)
	case "ServiceAccount":
		var sa corev1.ServiceAccount
		if err := strict(&sa); err != nil {
			return err
		}
		inv.serviceAccounts[sa.Name] = true
	case "ClusterRole":
		return strict(&rbacv1.ClusterRole{})
	case "NetworkPolicy":
		var np networkingv1.NetworkPolicy
		if err := strict(&np); err != nil {
			return err
		}
		inv.policies = append(inv.policies, &np)
	case "ConfigMap":
		var cm corev1.ConfigMap
		if err := strict(&cm); err != nil {
			return err
		}
		inv.configMaps[cm.Name] = &cm
	case "Service":
		var s corev1.Service
		if err := strict(&s); err != nil {
			return err
		}
		inv.services = append(inv.services, &s)
	case "PodDisruptionBudget":
		var p policyv1.PodDisruptionBudget
		if err := strict(&p); err != nil {
			return err
		}
		inv.pdbs = append(inv.pdbs, &p)
	case "Deployment":
		var d appsv1.Deployment
		if err := strict(&d); err != nil {
			return err
		}
		inv.workloads = append(inv.workloads, &workload{tm.Kind, d.Name, d.Namespace, ptrOr(d.Spec.Replicas, 1), d.Spec.Template.Labels, d.Spec.Template.Spec})
	case "DaemonSet":
		// One pod per node: replicas 0 says "as many as nodes" (no PDB can count on it).
		var d appsv1.DaemonSet
		if err := strict(&d); err != nil {
			return err
		}
		inv.workloads = append(inv.workloads, &workload{tm.Kind, d.Name, d.Namespace, 0, d.Spec.Template.Labels, d.Spec.Template.Spec})
	case "StatefulSet":
		var s appsv1.StatefulSet
		if err := strict(&s); err != nil {
			return err
		}
		inv.workloads = append(inv.workloads, &workload{tm.Kind, s.Name, s.Namespace, ptrOr(s.Spec.Replicas, 1), s.Spec.Template.Labels, s.Spec.Template.Spec})
	}
	return nil
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// build runs kustomize on dir, as `kubectl apply -k` would.
func build(t *testing.T, dir string) []byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Every plain YAML file decodes strictly on its own too (kubectl apply -f works).
func TestEveryManifestFileDecodesStrictly(t *testing.T) {
	files, _ := filepath.Glob("base/*.yaml")
	for _, dir := range []string{"external-nats", "token-review"} {
		extra, _ := filepath.Glob(dir + "/*.yaml")
		files = append(files, extra...)
	}
	n := 0
	for _, f := range files {
		if b := filepath.Base(f); b == "kustomization.yaml" || b == "signer-tokenreview.yaml" { // patches: partial objects
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeAll(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		n++
	}
	if n < 5 {
		t.Fatalf("only %d manifest files found", n)
	}
}

func TestStrictDecodeRefusesUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 1, targetport: a}]\n",
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
		"apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
		"apiVersion: apps/v1beta1\nkind: Deployment\nmetadata: {name: x}\n",
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  updateStrategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 1, partition: 1}}\n",
	} {
		if _, err := decodeAll([]byte(doc)); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
}
