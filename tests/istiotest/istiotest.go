// Package istiotest runs Istio's own control plane, istiod (pilot-discovery), for
// tests: the binary hack/istio.sh builds from the Go module proxy, as a process on
// loopback against a real API server (tests/kubetest) that has Istio's CRDs from
// the same module, the istio-system namespace and the mesh config in the
// ConfigMap istio, as Istio's Helm chart leaves a cluster. istiod then runs its
// own CA (self-signed into the Secret istio-ca-secret), checks pods' tokens by
// TokenReview, writes istio-ca-root-cert into every namespace, and serves xDS on
// its plaintext (15010) and mutual-TLS (15012) ports.
//
// What a cluster would give istiod and a loopback process lacks, set here:
//   - POD_NAMESPACE=istio-system, POD_NAME: istiod's own pod (leader election, the CA's namespace);
//   - ISTIOD_CUSTOM_HOST=127.0.0.1,localhost: names in istiod's serving certificate,
//     so that a client dialling 127.0.0.1 verifies it (the Service name istiod.istio-system.svc is in it too);
//   - INJECT_ENABLED=false, INJECTION_WEBHOOK_CONFIG_NAME="", VALIDATION_WEBHOOK_CONFIG_NAME="":
//     no webhook configurations to patch (nothing calls a webhook on loopback);
//   - every listener on a free loopback port (--httpAddr, --grpcAddr, ...), and a
//     working directory of the test's own (istiod writes relative paths).
//
// Tests that use it carry the build tag istio (make test-istio). Without the
// binaries they skip, saying how to build them, unless MESHAGENT_REQUIRE_ISTIO=1
// makes them fail.
package istiotest

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// Version is the istio.io/istio module version hack/istio.sh builds.
const Version = "v0.0.0-20260827124520-eed52ebb66ad"

// Namespace is istiod's namespace.
const Namespace = "istio-system"

// StartTimeout bounds istiod's start (its caches sync, its CA is made).
const StartTimeout = 2 * time.Minute

// Dir is where hack/istio.sh puts pilot-discovery, pilot-agent and
// crd-all.gen.yaml: $MESHAGENT_ISTIO_CACHE, by default
// ${XDG_CACHE_HOME:-$HOME/.cache}/meshagent/istio-<Version>/.
func Dir() string {
	if dir := os.Getenv("MESHAGENT_ISTIO_CACHE"); dir != "" {
		return dir
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "meshagent", "istio-"+Version)
}

// Require skips t, or fails it when MESHAGENT_REQUIRE_ISTIO=1, unless the
// binaries and CRDs hack/istio.sh builds are there.
func Require(t testing.TB) {
	t.Helper()
	for _, f := range []string{"pilot-discovery", "crd-all.gen.yaml"} {
		if _, err := os.Stat(filepath.Join(Dir(), f)); err != nil {
			msg := fmt.Sprintf("no %s in %s (build it with hack/istio.sh, or run make test-istio)", f, Dir())
			if os.Getenv("MESHAGENT_REQUIRE_ISTIO") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// Config is what a test sets of istiod.
type Config struct {
	// Mesh is MeshConfig as YAML, the ConfigMap istio's key mesh (empty: Istio's defaults).
	Mesh string
	// Env is istiod's environment beyond the harness's ("NAME=value"), such as
	// DEFAULT_WORKLOAD_CERT_TTL, MAX_WORKLOAD_CERT_TTL or ISTIO_MULTIROOT_MESH.
	Env []string
}

// Istiod is a running istiod.
type Istiod struct {
	Kube *kubetest.Server
	// GRPCAddr is the plaintext xDS port (Istio's 15010), SecureAddr the mutual-TLS
	// xDS and CA port (15012), HTTPAddr the debug and readiness port (8080: /ready,
	// /debug/syncz), MonitoringAddr its metrics (15014).
	GRPCAddr, SecureAddr, HTTPAddr, MonitoringAddr string
	Logs                                           *testkit.Buffer
}

// Start applies Istio's CRDs and the istio-system namespace to kube, runs istiod
// against it and waits until istiod reports ready. istiod is stopped when the test
// ends (its output logged if the test failed).
func Start(t testing.TB, kube *kubetest.Server, cfg Config) *Istiod {
	t.Helper()
	Require(t)
	applyCRDs(t, kube)
	kube.Admin.Namespace(t, Namespace, nil)
	kube.Admin.Create(t, "/api/v1/namespaces/"+Namespace+"/configmaps", map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap", "metadata": kubetest.Meta{Name: "istio"},
		"data": map[string]string{"mesh": cfg.Mesh, "meshNetworks": "networks: {}"},
	})
	d := &Istiod{Kube: kube, GRPCAddr: testkit.FreeAddr(t), SecureAddr: testkit.FreeAddr(t),
		HTTPAddr: testkit.FreeAddr(t), MonitoringAddr: testkit.FreeAddr(t), Logs: &testkit.Buffer{}}
	work := t.TempDir()
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(Kubeconfig(kube)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(Dir(), "pilot-discovery"), "discovery",
		"--kubeconfig", kubeconfig,
		// No mesh config files: istiod then reads the ConfigMap istio, as in a cluster.
		"--meshConfig", filepath.Join(work, "no-mesh-file"), "--networksConfig", filepath.Join(work, "no-networks-file"),
		"--httpAddr", d.HTTPAddr, "--httpsAddr", testkit.FreeAddr(t), "--grpcAddr", d.GRPCAddr,
		"--secureGRPCAddr", d.SecureAddr, "--monitoringAddr", d.MonitoringAddr,
		"--domain", "cluster.local", "--profile=false", "--log_output_level", "default:info")
	cmd.Dir = work
	cmd.Env = append(os.Environ(),
		"POD_NAMESPACE="+Namespace, "POD_NAME=istiod-test", "CLUSTER_ID=Kubernetes",
		"ISTIOD_CUSTOM_HOST=127.0.0.1,localhost",
		"INJECT_ENABLED=false", "INJECTION_WEBHOOK_CONFIG_NAME=", "VALIDATION_WEBHOOK_CONFIG_NAME=",
		"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false")
	cmd.Env = append(cmd.Env, cfg.Env...)
	kubetest.Run(t, d.Logs, "istiod", cmd)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod:\n%s", d.Logs.String())
		}
	})
	if !testkit.Poll(StartTimeout, func() bool {
		code, _ := testkit.HTTPGetWithin("http://"+d.HTTPAddr+"/ready", 5*time.Second)
		return code == http.StatusOK
	}) {
		t.Fatalf("istiod not ready after %s:\n%s", StartTimeout, d.Logs.String())
	}
	return d
}

// Kubeconfig is a kubeconfig for kube's admin.
func Kubeconfig(kube *kubetest.Server) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster: {server: %q, certificate-authority: %q}
users:
- name: admin
  user: {tokenFile: %q}
contexts:
- name: kubetest
  context: {cluster: kubetest, user: admin}
current-context: kubetest
`, kube.URL, kube.CAFile, kube.AdminTokenFile)
}

// applyCRDs applies crd-all.gen.yaml and waits until the API server serves the
// kinds istiod watches.
func applyCRDs(t testing.TB, kube *kubetest.Server) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(Dir(), "crd-all.gen.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := 0
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(doc), []byte("---")))) == 0 {
			continue
		}
		if _, _, err := kube.Admin.ApplyYAML(ctx, doc, "istiotest", ""); err != nil {
			t.Fatalf("apply Istio's CRDs: %v", err)
		}
		n++
	}
	if n < 10 {
		t.Fatalf("crd-all.gen.yaml held %d documents, want Istio's CRDs", n)
	}
	for _, gv := range []string{"networking.istio.io/v1", "security.istio.io/v1", "telemetry.istio.io/v1", "extensions.istio.io/v1alpha1", "networking.istio.io/v1beta1"} {
		testkit.EventuallyWithin(t, StartTimeout, "the API server serves "+gv, func() bool {
			code, _, err := kube.Admin.Do(ctx, http.MethodGet, "/apis/"+gv, nil, "")
			return err == nil && code == http.StatusOK
		})
	}
}

// RootCert waits for the ConfigMap istio-ca-root-cert that istiod writes into
// namespace ns (what a pod mounts at ./var/run/secrets/istio/root-cert.pem) and
// returns its root-cert.pem.
func (d *Istiod) RootCert(t testing.TB, ns string) (string, []*x509.Certificate) {
	t.Helper()
	var pemText string
	var roots []*x509.Certificate
	testkit.EventuallyWithin(t, StartTimeout, "istiod's istio-ca-root-cert in "+ns, func() bool {
		var cm struct {
			Data map[string]string `json:"data"`
		}
		code, raw, err := d.Kube.Admin.Do(context.Background(), http.MethodGet, "/api/v1/namespaces/"+ns+"/configmaps/istio-ca-root-cert", nil, "")
		if err != nil || code != http.StatusOK || json.Unmarshal(raw, &cm) != nil {
			return false
		}
		pemText = cm.Data["root-cert.pem"]
		roots, err = pki.ParseCertsPEM([]byte(pemText))
		return err == nil && len(roots) > 0
	})
	return pemText, roots
}

// Syncz is istiod's /debug/syncz: every proxy connected to it and, per type,
// the nonce it last sent and the one the proxy last acknowledged.
func (d *Istiod) Syncz(t testing.TB) []SyncStatus {
	t.Helper()
	code, body := testkit.HTTPGetWithin("http://"+d.HTTPAddr+"/debug/syncz", 10*time.Second)
	if code != http.StatusOK {
		t.Fatalf("istiod /debug/syncz: %d %s", code, body)
	}
	var out []SyncStatus
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("istiod /debug/syncz: %v\n%s", err, body)
	}
	return out
}

// SyncStatus is one proxy of istiod's /debug/syncz (pilot/pkg/xds/debug.go).
type SyncStatus struct {
	ClusterID     string `json:"cluster_id"`
	ProxyID       string `json:"proxy"`
	ProxyType     string `json:"proxy_type"`
	IstioVersion  string `json:"istio_version"`
	ClusterSent   string `json:"cluster_sent"`
	ClusterAcked  string `json:"cluster_acked"`
	ListenerSent  string `json:"listener_sent"`
	ListenerAcked string `json:"listener_acked"`
	Resources     map[string]struct {
		Sent      string `json:"sent"`
		Acked     string `json:"acked"`
		LastError string `json:"lastError"`
	} `json:"resources"`
}

// InSync says whether istiod's last cluster and listener pushes to the proxy are
// acknowledged, as istioctl proxy-status reports SYNCED, and no type carries an error.
func (s SyncStatus) InSync() bool {
	if s.ClusterSent == "" || s.ListenerSent == "" || s.ClusterSent != s.ClusterAcked || s.ListenerSent != s.ListenerAcked {
		return false
	}
	for _, r := range s.Resources {
		if r.LastError != "" || r.Sent != r.Acked {
			return false
		}
	}
	return true
}

// String is the status in one line, for failure messages.
func (s SyncStatus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s, %s): CDS %s/%s LDS %s/%s", s.ProxyID, s.ProxyType, s.IstioVersion, s.ClusterSent, s.ClusterAcked, s.ListenerSent, s.ListenerAcked)
	for typ, r := range s.Resources {
		fmt.Fprintf(&b, "; %s %s/%s %s", typ[strings.LastIndex(typ, ".")+1:], r.Sent, r.Acked, r.LastError)
	}
	return b.String()
}

// Counter is the sum of every series of metric name on istiod's monitoring port
// (its name with or without Prometheus's _total suffix), 0 when absent.
func (d *Istiod) Counter(t testing.TB, name string) float64 {
	t.Helper()
	code, body := testkit.HTTPGetWithin("http://"+d.MonitoringAddr+"/metrics", 10*time.Second)
	if code != http.StatusOK {
		t.Fatalf("istiod /metrics: %d %s", code, body)
	}
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		series := f[0]
		if i := strings.IndexByte(series, '{'); i >= 0 {
			series = series[:i]
		}
		if series != name && series != name+"_total" {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(f[1], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// LogLine is the last line of logs that holds s ("" if none), to show what istiod said.
func LogLine(logs, s string) string {
	lines := strings.Split(logs, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}
