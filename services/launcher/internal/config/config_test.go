package config

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"

	"github.com/meshagent/meshagent/pkg/events"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

func none(string) string { return "" }

func TestLoadResolvesPathsUnderPodRootAndJoinsTheBusAsThePod(t *testing.T) {
	c, err := Load([]string{"-pod", "web-0", "-pod-root", "/pods/web-0"}, none)
	if err != nil {
		t.Fatal(err)
	}
	if c.SDSSocket != filepath.Join("/pods/web-0", "var/run/secrets/workload-spiffe-uds/socket") ||
		c.OutputCerts != "/pods/web-0/etc/istio-output-certs" || c.GRPCBootstrap != "/pods/web-0/etc/istio/proxy/grpc-bootstrap.json" {
		t.Fatalf("paths %s %s %s", c.SDSSocket, c.OutputCerts, c.GRPCBootstrap)
	}
	p := c.Process()
	if p.Bus == nil || p.Bus.InboxPrefix != "_INBOX.pod.default.web-0" || p.Bus.Pod != "default/web-0" || p.Name != "launcher" || p.HTTP != "127.0.0.1:15021" {
		t.Fatalf("process %+v bus %+v", p, p.Bus)
	}
	if c.Pod.DNSDomain != "default.svc.cluster.local" || c.Pod.IPs[0] != "127.0.0.1" || c.Listen.Status != ":15020" {
		t.Fatalf("pod %+v status %s", c.Pod, c.Listen.Status)
	}
}

func TestIstioEnvNames(t *testing.T) {
	env := map[string]string{
		"POD_NAME": "web-0", "POD_NAMESPACE": "shop", "INSTANCE_IP": "10.0.0.7,fd00::7",
		"ISTIO_METAJSON_LABELS": `{"app":"web"}`, "TERMINATION_DRAIN_DURATION": "7s", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true",
		"MINIMUM_DRAIN_DURATION": "3s", "DISABLE_ENVOY": "true", "OUTPUT_CERTS": "/certs", "GRPC_XDS_BOOTSTRAP": "/b.json",
		"ISTIO_KUBE_APP_PROBERS": `{"/app-health/web/livez":{"tcpSocket":{"port":8080}}}`, "CUSTOM_BOOTSTRAP": "/custom.json",
	}
	c, err := Load(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.PodRef() != (events.PodRef{Namespace: "shop", Name: "web-0"}) || c.Bus.Pod != "shop/web-0" {
		t.Fatalf("pod on the bus %v, claim %q", c.PodRef(), c.Bus.Pod)
	}
	if _, err := Load([]string{"-pod", "web-0", "-namespace", "sh.op"}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "-pod/-namespace") {
		t.Fatalf("namespace sh.op: %v", err)
	}
	if c.Pod.Namespace != "shop" || c.Pod.DNSDomain != "shop.svc.cluster.local" || len(c.Pod.IPs) != 2 || c.Pod.Labels["app"] != "web" ||
		c.Drain.Duration.String() != "7s" || !c.Drain.ExitOnZero || c.Drain.MinDuration.String() != "3s" || !c.Envoy.Disabled ||
		c.OutputCerts != "/certs" || c.GRPCBootstrap != "/b.json" || c.Status.AppProbers == "" || c.Envoy.CustomBootstrap != "/custom.json" {
		t.Fatalf("config %+v", c)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	_, err := Load([]string{"-drain-time", "-1s", "-wait-for", "0s", "-log-level", "loud", "-instance-ip", "nope",
		"-proxy-type", "gateway", "-labels", "[1]", "-app-probers", "{", "-drain-deadline", "0s",
		"-custom-bootstrap", "a", "-bootstrap-template", "b", "-envoy-admin", "15000"}, none)
	if err == nil {
		t.Fatal("want error")
	}
	for _, f := range []string{"-pod", "-drain-time", "-wait-for", "-log-level", "-instance-ip", "-proxy-type", "-labels",
		"-app-probers", "-drain-deadline", "-custom-bootstrap", "-envoy-admin"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
}

// -h lists every knob with its env var; those Istio has name it.
func TestHelpNamesIstiosKnobs(t *testing.T) {
	_, err := Load([]string{"-h"}, none)
	var out bytes.Buffer
	if !flagenv.PrintHelp(err, &out) {
		t.Fatalf("-h: %v", err)
	}
	for _, w := range []string{"TERMINATION_DRAIN_DURATION", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "MINIMUM_DRAIN_DURATION",
		"ISTIO_KUBE_APP_PROBERS", "DISABLE_ENVOY", "OUTPUT_CERTS", "GRPC_XDS_BOOTSTRAP", "CUSTOM_BOOTSTRAP", "ISTIO_BOOTSTRAP",
		"INSTANCE_IP", "POD_NAMESPACE", "ISTIO_METAJSON_LABELS", "ISTIO_META_CLUSTER_ID", "--statusPort", "--proxyLogLevel",
		"--proxyComponentLogLevel", "--concurrency", "drainDuration", "parentShutdownDuration", "--binaryPath", "1337", "terminationDrainDuration", "proxyLogLevel", "serviceCluster"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("-h lacks %s", w)
		}
	}
	if n, e := strings.Count(out.String(), "\n  -"), strings.Count(out.String(), "\tenv "); n != e {
		t.Errorf("%d flags, %d env lines", n, e)
	}
}

// Istio's `pilot-agent proxy router` form sets the proxy type; anything else after
// `proxy` is refused, naming what was given; a router's mode is checked.
func TestProxyCommandAndRouterMode(t *testing.T) {
	c, err := Load([]string{"proxy", "router", "-pod", "ingress-0"}, none)
	if err != nil || c.Pod.Type != Router || c.Pod.RouterMode != "standard" {
		t.Fatalf("proxy router: %+v %v", c.Pod, err)
	}
	if c.CredentialSocket != filepath.Join(c.Pod.RootDir, "var/run/secrets/workload-spiffe-uds/credential-socket") {
		t.Fatalf("credential socket %q", c.CredentialSocket)
	}
	if c, err = Load([]string{"proxy", "sidecar", "-pod", "web-0"}, none); err != nil || c.Pod.Type != Sidecar {
		t.Fatalf("proxy sidecar: %v %v", c.Pod.Type, err)
	}
	if _, err := Load([]string{"proxy", "gateway", "-pod", "x"}, none); err == nil || !strings.Contains(err.Error(), `want `+"`proxy sidecar`") {
		t.Fatalf("proxy gateway: %v", err)
	}
	if _, err := Load([]string{"proxy", "router", "-pod", "x", "-router-mode", "fast"}, none); err == nil || !strings.Contains(err.Error(), "-router-mode") {
		t.Fatalf("bad router mode: %v", err)
	}
}

// TestProxyConfigSetsDefaultsUnderEnvAndFlags: PROXY_CONFIG's fields set the
// launcher's knobs, an env var or flag of the same knob overrides it, and
// pilot-agent's own `proxy sidecar` flags from Istio's template are taken.
func TestProxyConfigSetsDefaultsUnderEnvAndFlags(t *testing.T) {
	env := map[string]string{
		"POD_NAME": "web-0",
		"PROXY_CONFIG": `{"statusPort":15120,"proxyAdminPort":15100,"drainDuration":"30s","terminationDrainDuration":"9s",
			"binaryPath":"/opt/envoy","concurrency":4,"proxyMetadata":{"PROXY_LOG_LEVEL":"debug"},"holdApplicationUntilProxyStarts":true}`,
	}
	getenv := func(k string) string { return env[k] }
	c, err := Load([]string{"proxy", "sidecar", "--domain", "shop.svc.cluster.local", "--serviceCluster", "web.shop",
		"--proxyComponentLogLevel=misc:info", "--log_output_level=default:info", "--log_as_json"}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen.Status != ":15120" || c.Envoy.AdminAddr != "127.0.0.1:15100" || c.Envoy.DrainDuration != 30*time.Second ||
		c.Drain.Duration != 9*time.Second || c.Envoy.Binary != "/opt/envoy" || c.Envoy.Concurrency != 4 {
		t.Fatalf("from PROXY_CONFIG: status %q admin %q drain %s term %s binary %q concurrency %d",
			c.Listen.Status, c.Envoy.AdminAddr, c.Envoy.DrainDuration, c.Drain.Duration, c.Envoy.Binary, c.Envoy.Concurrency)
	}
	if c.Envoy.LogLevel != "debug" || c.Envoy.ComponentLevel != "misc:info" || !c.Log.JSON || c.Pod.DNSDomain != "shop.svc.cluster.local" {
		t.Fatalf("proxyMetadata/flags: level %q component %q json %v domain %q", c.Envoy.LogLevel, c.Envoy.ComponentLevel, c.Log.JSON, c.Pod.DNSDomain)
	}
	env["TERMINATION_DRAIN_DURATION"] = "2s"
	c, err = Load([]string{"-concurrency", "1", "-proxyLogLevel", "info"}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Drain.Duration != 2*time.Second || c.Envoy.Concurrency != 1 || c.Envoy.LogLevel != "info" {
		t.Fatalf("env and flags over PROXY_CONFIG: drain %s concurrency %d level %q", c.Drain.Duration, c.Envoy.Concurrency, c.Envoy.LogLevel)
	}
	env["PROXY_CONFIG"] = `{"statusPort":0}`
	if c, err = Load(nil, getenv); err != nil || c.Listen.Status != "" {
		t.Fatalf("statusPort 0: status %q, %v", c.Listen.Status, err)
	}
	env["PROXY_CONFIG"] = `{"statusPort":15120,"drainDurationn":"5s"}`
	if _, err = Load(nil, getenv); err == nil || !strings.Contains(err.Error(), "PROXY_CONFIG") || !strings.Contains(err.Error(), "drainDurationn") {
		t.Fatalf("a misspelt field: %v", err)
	}
}

// ISTIO_PROMETHEUS_ANNOTATIONS, as Istio's injector writes it from the pod's
// prometheus.io annotations: the app's metrics URL, always on localhost.
func TestPrometheusAnnotations(t *testing.T) {
	for in, want := range map[string]string{
		`{"scrape":"true","port":"8080","path":"/stats"}`: "http://localhost:8080/stats",
		`{"scrape":"true","port":"9090"}`:                 "http://localhost:9090/metrics",
		`{"scrape":"false","port":"9090"}`:                "",
		``:                                                "",
	} {
		c, err := Load([]string{"-pod", "web-0"}, func(k string) string {
			return map[string]string{"ISTIO_PROMETHEUS_ANNOTATIONS": in}[k]
		})
		if err != nil || c.Status.AppMetricsURL != want {
			t.Errorf("%s: %q, %v; want %q", in, c.Status.AppMetricsURL, err, want)
		}
	}
	for _, in := range []string{`{"scrape":"true"}`, `{"scrape":"true","port":"80","path":"@evil.example/x"}`,
		`{"scrape":"true","port":"80","host":"evil.example"}`, `[1]`} {
		if _, err := Load([]string{"-pod", "web-0", "-prometheus-annotations", in}, none); err == nil || !strings.Contains(err.Error(), "-prometheus-annotations") {
			t.Errorf("%s: %v, want an error naming -prometheus-annotations", in, err)
		}
	}
}

// TestCPULimitSetsConcurrencyAsPilotAgent: ISTIO_CPU_LIMIT is Envoy's
// --concurrency when ProxyConfig's concurrency is unset, as pilot-agent does
// (pilot/cmd/pilot-agent/config ConstructProxyConfig; checked against a real
// pilot-agent: --concurrency 4 under ISTIO_CPU_LIMIT=4, 3 with concurrency 3 in
// PROXY_CONFIG); a given concurrency, 0 included, wins.
func TestCPULimitSetsConcurrencyAsPilotAgent(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{"neither: meshagent's default", nil, nil, 2},
		{"cpu limit", nil, map[string]string{"ISTIO_CPU_LIMIT": "4"}, 4},
		{"PROXY_CONFIG's concurrency wins", nil, map[string]string{"ISTIO_CPU_LIMIT": "4", "PROXY_CONFIG": `{"concurrency":3}`}, 3},
		{"PROXY_CONFIG's concurrency 0 wins", nil, map[string]string{"ISTIO_CPU_LIMIT": "4", "PROXY_CONFIG": `{"concurrency":0}`}, 0},
		{"the flag wins (pilot-agent's --concurrency)", []string{"--concurrency", "1"}, map[string]string{"ISTIO_CPU_LIMIT": "4"}, 1},
		{"the env var wins", nil, map[string]string{"ISTIO_CPU_LIMIT": "4", "ISTIO_META_CONCURRENCY": "5"}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(append([]string{"-pod", "web-0"}, tc.args...), flagenv.Map(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.Envoy.Concurrency != tc.want {
				t.Fatalf("concurrency %d, want %d", c.Envoy.Concurrency, tc.want)
			}
		})
	}
	if _, err := Load([]string{"-pod", "web-0"}, flagenv.Map(map[string]string{"ISTIO_CPU_LIMIT": "-1"})); err == nil || !strings.Contains(err.Error(), "-cpu-limit") {
		t.Fatalf("negative cpu limit: %v", err)
	}
}

// TestPodLabelsFileAsPilotAgent: the downward-API labels file under the pod root
// is merged over ISTIO_METAJSON_LABELS, pod-template-hash left out (Istio's
// pkg/bootstrap GetNodeMetaData); a missing file leaves the JSON labels; a file
// that does not parse is an error naming the flag.
func TestPodLabelsFileAsPilotAgent(t *testing.T) {
	root := t.TempDir()
	env := map[string]string{"ISTIO_METAJSON_LABELS": `{"app":"static","team":"a"}`}
	c, err := Load([]string{"-pod", "web-0", "-pod-root", root}, flagenv.Map(env))
	if err != nil || len(c.Pod.Labels) != 2 || c.Pod.Labels["app"] != "static" {
		t.Fatalf("no file: labels %v, %v", c.Pod.Labels, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/istio/pod"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "etc/istio/pod/labels")
	if err := os.WriteFile(file, []byte("app=\"web\"\npod-template-hash=\"7d4f9\"\nsecurity.istio.io/tlsMode=\"istio\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err = Load([]string{"-pod", "web-0", "-pod-root", root}, flagenv.Map(env)); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"app": "web", "team": "a", "security.istio.io/tlsMode": "istio"}
	if !maps.Equal(c.Pod.Labels, want) || c.Pod.LabelsFile != file {
		t.Fatalf("labels %v from %s, want %v", c.Pod.Labels, c.Pod.LabelsFile, want)
	}
	if err := os.WriteFile(file, []byte("app=web\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err = Load([]string{"-pod", "web-0", "-pod-root", root}, flagenv.Map(env)); err == nil || !strings.Contains(err.Error(), "-pod-labels-file") {
		t.Fatalf("unquoted value: %v", err)
	}
}
