package istiotest

// Workloads as istiod sees them in the API server: there is no kubelet and no
// controller manager, so a pod is created already bound to a node and its status
// (IP, phase, readiness) is written by the test, as a kubelet would write it.

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/meshagent/meshagent/tests/kubetest"
)

// Pod creates pod ns/name of service account sa with labels, running and ready
// at ip (status.podIP, written through the status subresource), and returns its uid.
func Pod(t testing.TB, kube *kubetest.Server, ns, name, sa, ip string, labels map[string]string) string {
	t.Helper()
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": kubetest.Meta{Name: name, Labels: labels},
		"spec": map[string]any{
			"serviceAccountName": sa, "nodeName": "node-a", "automountServiceAccountToken": false,
			"containers": []any{map[string]any{"name": "app", "image": "registry.invalid/app:1",
				"ports": []any{map[string]any{"name": "http", "containerPort": 8080}}}},
		},
	}
	out := kube.Admin.Create(t, "/api/v1/namespaces/"+ns+"/pods", pod)
	uid, _ := out["metadata"].(map[string]any)["uid"].(string)
	if uid == "" {
		t.Fatalf("pod %s/%s created without a uid: %v", ns, name, out)
	}
	status := map[string]any{"status": map[string]any{
		"phase": "Running", "podIP": ip, "podIPs": []any{map[string]any{"ip": ip}}, "hostIP": "172.18.0.3",
		"conditions": []any{map[string]any{"type": "Ready", "status": "True"}, map[string]any{"type": "ContainersReady", "status": "True"}},
	}}
	b, err := json.Marshal(status)
	if err != nil {
		t.Fatal(err)
	}
	code, raw, err := kube.Admin.Do(t.Context(), http.MethodPatch, "/api/v1/namespaces/"+ns+"/pods/"+name+"/status", b, "application/merge-patch+json")
	if err != nil || code != http.StatusOK {
		t.Fatalf("patch pod %s/%s status: %d %v %s", ns, name, code, err, raw)
	}
	return uid
}

// Service creates a ClusterIP Service ns/name selecting labels, port 80 to the
// pods' 8080, and returns the cluster IP the API server allocated.
func Service(t testing.TB, kube *kubetest.Server, ns, name string, selector map[string]string) string {
	t.Helper()
	out := kube.Admin.Create(t, "/api/v1/namespaces/"+ns+"/services", map[string]any{
		"apiVersion": "v1", "kind": "Service", "metadata": kubetest.Meta{Name: name},
		"spec": map[string]any{"selector": selector, "ports": []any{map[string]any{"name": "http", "port": 80, "targetPort": 8080}}},
	})
	ip, _ := out["spec"].(map[string]any)["clusterIP"].(string)
	if ip == "" {
		t.Fatalf("service %s/%s has no cluster IP: %v", ns, name, out)
	}
	return ip
}
