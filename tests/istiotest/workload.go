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

// VMEnv is what an Istio install for virtual machines sets of istiod (Istio's
// virtual-machine install: values.pilot.env): WorkloadEntry auto-registration,
// and health checks, by which istiod writes the agents' health reports into
// their WorkloadEntries' Healthy condition. Both are also istiod's defaults in
// the version built here (pilot/pkg/features); an install sets them anyway.
var VMEnv = []string{"PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION=true", "PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS=true"}

// WorkloadGroup creates the networking.istio.io/v1 WorkloadGroup ns/name whose
// WorkloadEntries run as service account sa with labels, and probe (Istio's
// ReadinessProbe as JSON, nil for none): what `istioctl x workload entry
// configure` turns into a VM's readinessProbe, and what the group's agents must
// be given (istiod itself does not read it).
func WorkloadGroup(t testing.TB, kube *kubetest.Server, ns, name, sa string, labels map[string]string, probe map[string]any) {
	t.Helper()
	spec := map[string]any{
		"metadata": map[string]any{"labels": labels},
		"template": map[string]any{"serviceAccount": sa, "labels": labels},
	}
	if probe != nil {
		spec["probe"] = probe
	}
	kube.Admin.Create(t, "/apis/networking.istio.io/v1/namespaces/"+ns+"/workloadgroups", map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup", "metadata": kubetest.Meta{Name: name}, "spec": spec,
	})
}

// WorkloadEntry is the part of a WorkloadEntry the tests read.
type WorkloadEntry struct {
	Metadata struct {
		Name        string            `json:"name"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Address        string            `json:"address"`
		ServiceAccount string            `json:"serviceAccount"`
		Labels         map[string]string `json:"labels"`
	} `json:"spec"`
	Status struct {
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// Healthy is the entry's Healthy condition (status and message); ok is false
// when it has none.
func (e WorkloadEntry) Healthy() (status, message string, ok bool) {
	for _, c := range e.Status.Conditions {
		if c.Type == "Healthy" {
			return c.Status, c.Message, true
		}
	}
	return "", "", false
}

// GetWorkloadEntry reads WorkloadEntry ns/name from the API server; ok is false
// when there is none.
func GetWorkloadEntry(t testing.TB, kube *kubetest.Server, ns, name string) (WorkloadEntry, bool) {
	t.Helper()
	var e WorkloadEntry
	code, raw, err := kube.Admin.Do(t.Context(), http.MethodGet, "/apis/networking.istio.io/v1/namespaces/"+ns+"/workloadentries/"+name, nil, "")
	if err != nil {
		t.Fatalf("get workloadentry %s/%s: %v", ns, name, err)
	}
	switch code {
	case http.StatusNotFound:
		return e, false
	case http.StatusOK:
	default:
		t.Fatalf("get workloadentry %s/%s: %d %s", ns, name, code, raw)
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("workloadentry %s/%s: %v", ns, name, err)
	}
	return e, true
}

// WorkloadEntryNames lists the WorkloadEntries of ns.
func WorkloadEntryNames(t testing.TB, kube *kubetest.Server, ns string) []string {
	t.Helper()
	var list struct {
		Items []WorkloadEntry `json:"items"`
	}
	kube.Admin.Call(t, http.MethodGet, "/apis/networking.istio.io/v1/namespaces/"+ns+"/workloadentries", nil, &list)
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Metadata.Name)
	}
	return out
}
