package kubernetes_test

import (
	"os"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/deploy/kubernetes"
	"github.com/meshagent/meshagent/deploy/kubernetes/inject"
	"github.com/meshagent/meshagent/deploy/kubernetes/internal/strict"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// operatorObjects are created by the operator, not by the manifests (docs/kubernetes.md,
// "Install"): credentials from `meshctl bus-auth`, the CA KEK and bus TLS. The
// roots pods trust (istio-ca-root-cert) the signer publishes itself.
var operatorObjects = map[string]bool{
	"meshagent-signer-bus": true, "meshagent-rotator-bus": true, "meshagent-operator-bus": true, "meshagent-ca-kek": true,
	"meshagent-nats-tls": true, "meshagent-nats-auth": true, "meshagent-bus-ca": true,
}

func TestManifestsMatchBinaries(t *testing.T) {
	bins := bindings(t)
	for _, tt := range []struct {
		dir        string
		nats       bool
		signers    int32
		natsURLHas string
	}{
		{"base", true, 2, "nats-0.nats.meshagent-system.svc"},
		{"external-nats", false, 2, "nats.example.internal"},
		{"token-review", true, 2, "nats-0.nats.meshagent-system.svc"},
	} {
		t.Run(tt.dir, func(t *testing.T) {
			inv, err := decodeAll(build(t, tt.dir))
			if err != nil {
				t.Fatal(err)
			}
			c := &checker{bins: bins, inv: inv}
			for _, w := range inv.workloads {
				if w.namespace != "meshagent-system" {
					t.Errorf("%s/%s in namespace %q", w.kind, w.name, w.namespace)
				}
				c.workload(w)
			}
			c.fleet(inv, operatorObjects)
			for _, p := range c.problems {
				t.Error(p)
			}
			byName := map[string]*workload{}
			for _, w := range inv.workloads {
				byName[w.kind+"/"+w.name] = w
			}
			if w := byName["Deployment/signer"]; w == nil || w.replicas != tt.signers {
				t.Errorf("signer Deployment: %+v", w)
			}
			if byName["Deployment/rotator"] == nil {
				t.Error("no rotator Deployment")
			}
			if w := byName["Deployment/operator"]; w == nil || w.replicas != 2 {
				t.Errorf("operator Deployment: %+v, want 2 replicas", w)
			}
			if nats := byName["StatefulSet/nats"]; (nats != nil) != tt.nats || (nats != nil && nats.replicas != 3) {
				t.Errorf("nats StatefulSet: %+v, want present=%v with 3 replicas", nats, tt.nats)
			}
			if got := inv.configMaps["meshagent-config"].Data["nats-url"]; !strings.Contains(got, tt.natsURLHas) {
				t.Errorf("nats-url %q", got)
			}
			if inv.kinds["PodDisruptionBudget"] < 3 || inv.kinds["Service"] < 2 {
				t.Errorf("kinds %v", inv.kinds)
			}
		})
	}
}

// The namespace enforces Pod Security "restricted" (every pod in it is checked
// against it by TestManifestsMatchBinaries).
func TestNamespaceEnforcesRestricted(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	ns := inv.namespaces["meshagent-system"]
	if ns == nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Fatalf("namespace %+v", ns)
	}
}

// The token-review overlay turns discovery off and TokenReview on, and lets the
// signer's own service account (and only it) create TokenReviews.
func TestTokenReviewOverlay(t *testing.T) {
	inv, err := decodeAll(build(t, "token-review"))
	if err != nil {
		t.Fatal(err)
	}
	var signer *workload
	for _, w := range inv.workloads {
		if w.name == "signer" {
			signer = w
		}
	}
	env := map[string]string{}
	for _, e := range signer.spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["TOKEN_REVIEW"] != "true" || env["TOKEN_ISSUER_DISCOVERY"] != "false" || env["TOKEN_AUDIENCE"] != "istio-ca" ||
		env["TOKEN_ISSUER_CA_FILE"] != saTokenDir+"/ca.crt" || env["TOKEN_ISSUER_BEARER_FILE"] != saTokenDir+"/token" {
		t.Fatalf("signer env %v", env)
	}
	if signer.spec.AutomountServiceAccountToken == nil || !*signer.spec.AutomountServiceAccountToken {
		t.Fatal("the signer needs its service-account token to call the API server")
	}
	var b *rbacv1.ClusterRoleBinding
	for _, x := range inv.bindings {
		if x.RoleRef.Name == "system:auth-delegator" {
			b = x
		}
	}
	if b == nil || len(inv.bindings) != 2 {
		t.Fatalf("%d ClusterRoleBindings, none to system:auth-delegator", len(inv.bindings))
	}
	if b.RoleRef.Kind != "ClusterRole" || len(b.Subjects) != 1 ||
		b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != signer.spec.ServiceAccountName || b.Subjects[0].Namespace != signer.namespace {
		t.Fatalf("binding %+v", b)
	}
	// base binds one ClusterRole cluster-wide: the root ConfigMap publisher's
	// (what it allows is checked against a real API server in kube_test.go).
	base, err := decodeAll(build(t, "base"))
	if err != nil || len(base.bindings) != 1 || base.bindings[0].RoleRef.Name != "meshagent-signer-root-configmap" {
		t.Fatalf("base: %v, %d bindings", err, len(base.bindings))
	}
}

func TestNATSConfigIncludesBusAuthAndTLS(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	conf := inv.configMaps["nats-config"].Data["nats.conf"]
	for _, want := range []string{"include auth/nats-auth.conf", "jetstream", "cert_file: /etc/nats/tls/tls.crt", "verify: true",
		"nats-0.nats.meshagent-system.svc:6222", "nats-2.nats.meshagent-system.svc:6222",
		// One client's flood stays out of the server's memory (docs/security.md).
		"max_pending: 8MB", "max_buffered_size: 4MB", "max_buffered_msgs: 4096"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nats.conf lacks %q", want)
		}
	}
	// The include is relative to nats.conf: auth/ must be mounted beside it.
	for _, w := range inv.workloads {
		if w.name != "nats" {
			continue
		}
		mounts := map[string]string{}
		for _, m := range w.spec.Containers[0].VolumeMounts {
			mounts[m.MountPath] = m.Name
		}
		if mounts["/etc/nats/nats.conf"] != "config" || mounts["/etc/nats/auth"] != "auth" || mounts["/etc/nats/tls"] != "tls" {
			t.Errorf("nats mounts %v", mounts)
		}
	}
}

// samplePod is a workload as a user writes it: its own container and init container.
const sampleDeployment = `apiVersion: apps/v1
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
      annotations:
        meshagent.io/discovery-address: istiod-canary.istio-system.svc:15012
    spec:
      serviceAccountName: web
      initContainers:
        - name: migrate
          image: example/web-migrate:1
      containers:
        - name: web
          image: example/web:1
          ports: [{name: http, containerPort: 8080}]
`

func TestSidecarRendersForASamplePod(t *testing.T) {
	out, err := inject.Inject(kubernetes.SidecarTemplate, []byte(sampleDeployment), inject.DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := strict.Unmarshal(out, &d); err != nil {
		t.Fatalf("injected Deployment does not decode strictly: %v\n%s", err, out)
	}
	spec := d.Spec.Template.Spec
	var names []string
	for _, c := range spec.InitContainers {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "sds-edge,xds-relay,launcher,migrate" || len(spec.Containers) != 1 || spec.Containers[0].Name != "web" {
		t.Fatalf("containers: init %v, main %d", names, len(spec.Containers))
	}
	w := &workload{kind: "Deployment", name: d.Name, namespace: d.Namespace, replicas: *d.Spec.Replicas, labels: d.Spec.Template.Labels, spec: spec}
	c := &checker{bins: bindings(t)}
	c.workload(w)
	for _, p := range c.problems {
		t.Error(p)
	}

	env := map[string]map[string]string{}
	mountOf := map[string]map[string]string{}
	for _, ct := range spec.InitContainers[:3] {
		env[ct.Name] = map[string]string{}
		for _, e := range ct.Env {
			env[ct.Name][e.Name] = e.Value
		}
		mountOf[ct.Name] = map[string]string{}
		for _, m := range ct.VolumeMounts {
			mountOf[ct.Name][m.MountPath] = m.Name
		}
		if ct.RestartPolicy == nil || *ct.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("%s is not a native sidecar", ct.Name)
		}
		if n := env[ct.Name]["NATS_NKEY"] + env[ct.Name]["NATS_CREDS"]; n != "" {
			t.Errorf("%s has a bus credential %s: pods connect with their service-account token", ct.Name, n)
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			t.Errorf("the sidecar mounts Secret %s: pods get no bus secret", v.Secret.SecretName)
		}
	}
	// The three agree on the sockets they share, on a volume they share.
	sds := env["sds-edge"]["SDS_SOCKET"]
	for _, n := range []string{"xds-relay", "launcher"} {
		if env[n]["SDS_SOCKET"] != sds {
			t.Errorf("%s SDS_SOCKET %q, sds-edge serves %q", n, env[n]["SDS_SOCKET"], sds)
		}
		if mountOf[n]["/var/run/secrets/workload-spiffe-uds"] != mountOf["sds-edge"]["/var/run/secrets/workload-spiffe-uds"] {
			t.Errorf("%s does not share sds-edge's socket volume", n)
		}
	}
	if env["xds-relay"]["XDS_SOCKET"] != env["launcher"]["XDS_SOCKET"] || mountOf["xds-relay"]["/etc/istio/proxy"] != mountOf["launcher"]["/etc/istio/proxy"] {
		t.Error("xds-relay and launcher disagree on the ADS socket")
	}
	if env["xds-relay"]["DISCOVERY_ADDRESS"] != "istiod-canary.istio-system.svc:15012" {
		t.Errorf("the pod's discovery-address annotation was not used: %q", env["xds-relay"]["DISCOVERY_ADDRESS"])
	}
	// The token sds-edge signs with and both connect to the bus with: projected, for istio-ca.
	for _, v := range spec.Volumes {
		if v.Name != mountOf["sds-edge"]["/var/run/secrets/tokens"] {
			continue
		}
		if v.Projected == nil || len(v.Projected.Sources) != 1 || v.Projected.Sources[0].ServiceAccountToken == nil ||
			v.Projected.Sources[0].ServiceAccountToken.Audience != "istio-ca" ||
			"/var/run/secrets/tokens/"+v.Projected.Sources[0].ServiceAccountToken.Path != env["sds-edge"]["TOKEN_FILE"] ||
			env["xds-relay"]["XDS_TOKEN_FILE"] != env["sds-edge"]["TOKEN_FILE"] {
			t.Errorf("token volume %+v, TOKEN_FILE %q", v, env["sds-edge"]["TOKEN_FILE"])
		}
	}

	// Injected twice: refused, not doubled.
	if _, err := inject.Inject(kubernetes.SidecarTemplate, out, inject.DefaultValues()); err == nil || !strings.Contains(err.Error(), "injected already") {
		t.Fatalf("second injection: %v", err)
	}
	// A template with a misspelled field is refused at render time.
	bad := strings.Replace(kubernetes.SidecarTemplate, "readOnlyRootFilesystem", "readOnlyRootFileSystem", 1)
	if _, err := inject.Inject(bad, []byte(sampleDeployment), inject.DefaultValues()); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("misspelled template: %v", err)
	}
}

// The checks catch what they are for: each mutation of a good manifest is reported.
func TestCheckerCatchesMismatches(t *testing.T) {
	bins := bindings(t)
	base := build(t, "base")
	tests := []struct {
		name, from, to, want string
	}{
		{"env no binary reads", "- name: JWKS_MIN_REFRESH", "- name: JWKS_MIN_REFRESHES", "reads no such variable"},
		{"probe on another port", "value: 0.0.0.0:15093", "value: 0.0.0.0:15094", "no containerPort"},
		{"file on no volume", "value: /var/run/secrets/meshagent/ca-kek/ca-kek", "value: /etc/ca-kek", "on no volume"},
		{"file not in the secret", "value: /var/run/secrets/meshagent/bus/rotator.nk", "value: /var/run/secrets/meshagent/bus/rotor.nk", "holds no file"},
		{"world-readable seed", "defaultMode: 288\n          items:\n          - key: signer.nk", "defaultMode: 292\n          items:\n          - key: signer.nk", "lets others read it"},
		{"group-writable KEK", "defaultMode: 288\n          items:\n          - key: ca-kek", "defaultMode: 304\n          items:\n          - key: ca-kek", "lets its group write it"},
		{"service port", "targetPort: grpc-ca", "targetPort: grpc", "declares no such port"},
		{"missing ConfigMap key", "key: token-issuer", "key: token-issuers", "has no key token-issuers"},
		{"image", "image: meshagent/rotator:dev", "image: meshagent/rotater:dev", "runs no meshagent binary"},
		{"seed name", "- key: signer.nk\n            path: signer.nk", "- key: ca.nk\n            path: signer.nk", "no file `meshctl bus-auth` writes"},
		{"non-root reader without fsGroup", "        fsGroup: 65532\n", "", "cannot read a root-owned Secret file; set an fsGroup"},
		{"root", "runAsUser: 65532\n", "runAsUser: 0\n", "runAsUser 0"},
		{"runAsNonRoot off", "runAsNonRoot: true", "runAsNonRoot: false", "runAsNonRoot must be true"},
		{"privilege escalation", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "allowPrivilegeEscalation must be false"},
		{"capabilities kept", `- ALL`, `- NET_ADMIN`, "capabilities must drop ALL"},
		{"no seccomp", "type: RuntimeDefault", "type: Unconfined", "seccompProfile must be RuntimeDefault"},
		{"host network", "serviceAccountName: signer\n", "serviceAccountName: signer\n      hostNetwork: true\n", "host namespaces"},
		{"PDB over one replica", "replicas: 2", "replicas: 1", "no eviction could ever pass"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(string(base), tt.from) {
				t.Fatalf("base has no %q", tt.from)
			}
			inv, err := decodeAll([]byte(strings.Replace(string(base), tt.from, tt.to, 1)))
			if err != nil {
				t.Fatal(err)
			}
			c := &checker{bins: bins, inv: inv}
			for _, w := range inv.workloads {
				c.workload(w)
			}
			c.fleet(inv, operatorObjects)
			if !strings.Contains(strings.Join(c.problems, "\n"), tt.want) {
				t.Fatalf("not reported (%q); problems: %v", tt.want, c.problems)
			}
		})
	}
}

// docs/kubernetes.md names a command for every object the operator creates.
func TestDocCreatesEveryOperatorObject(t *testing.T) {
	doc, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range operatorObjects {
		if !strings.Contains(string(doc), "create secret generic "+name) && !strings.Contains(string(doc), "create configmap "+name) {
			t.Errorf("docs/kubernetes.md has no kubectl create for %s", name)
		}
	}
	for _, cmd := range []string{"meshctl bus-auth -out", "kubectl apply -k deploy/kubernetes/base", "kubectl apply -k deploy/kubernetes/token-review", "go run ./deploy/kubernetes/cmd/inject",
		"kubectl -n meshagent-system scale deployment/signer", "meshctl rotate root", "kubectl -n meshagent-system set image deployment/signer",
		"kubectl -n meshagent-system rollout status"} {
		if !strings.Contains(string(doc), cmd) {
			t.Errorf("docs/kubernetes.md does not name %q", cmd)
		}
	}
}

// The ConfigMap an injected pod mounts as its trust anchors is the one the signer
// of base publishes into every namespace (ROOT_CONFIGMAP), with the key it writes.
func TestSidecarMountsTheRootsTheSignerPublishes(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	published := ""
	for _, w := range inv.workloads {
		if w.name == "signer" {
			for _, e := range w.spec.Containers[0].Env {
				if e.Name == "ROOT_CONFIGMAP" {
					published = e.Value
				}
			}
		}
	}
	if published == "" {
		t.Fatal("the signer publishes no root ConfigMap (ROOT_CONFIGMAP)")
	}
	out, err := inject.Inject(kubernetes.SidecarTemplate, []byte(sampleDeployment), inject.DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := strict.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name != "meshagent-root-cert" {
			continue
		}
		if v.ConfigMap == nil || v.ConfigMap.Name != published || len(v.ConfigMap.Items) != 1 || v.ConfigMap.Items[0].Key != "root-cert.pem" {
			t.Fatalf("trust anchors volume %+v, want ConfigMap %s key root-cert.pem", v.VolumeSource, published)
		}
		return
	}
	t.Fatal("no meshagent-root-cert volume in the injected pod")
}
