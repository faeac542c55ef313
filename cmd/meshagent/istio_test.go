package main

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/flagenv/istioenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/launcher/launcher"
	"github.com/meshagent/meshagent/services/sds-edge/sdsedge"
	"github.com/meshagent/meshagent/services/xds-relay/xdsrelay"
	"github.com/meshagent/meshagent/tests/testkit"
)

// injected is one proxy container of testdata/istio-injected.json: what Istio's
// injection template gives it.
type injected struct {
	Args []string          `json:"args"`
	Env  map[string]string `json:"env"`
}

func loadInjected(t *testing.T) map[string]injected {
	t.Helper()
	b, err := os.ReadFile("testdata/istio-injected.json")
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]json.RawMessage
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]injected{}
	for _, k := range []string{"sidecar", "gateway"} {
		var in injected
		if err := json.Unmarshal(f[k], &in); err != nil {
			t.Fatal(err)
		}
		out[k] = in
	}
	return out
}

// roleConfigs are the three roles' configs loaded with the injected env (the
// launcher, as pilot-agent, also with its args); only the pod root is ours.
type roleConfigs struct {
	sds      sdsedge.Config
	relay    xdsrelay.Config
	launcher launcher.Config
}

func loadRoles(t *testing.T, in injected) roleConfigs {
	t.Helper()
	root := testkit.ShortDir(t) // paths aside: the pod's files live here
	env := maps.Clone(in.Env)
	env["POD_ROOT"] = root
	getenv := flagenv.Map(env)
	var rc roleConfigs
	var err error
	if rc.sds, err = sdsedge.Load(nil, getenv); err != nil {
		t.Fatalf("sds-edge with Istio's env: %v", err)
	}
	if rc.relay, err = xdsrelay.Load(nil, getenv); err != nil {
		t.Fatalf("xds-relay with Istio's env: %v", err)
	}
	if rc.launcher, err = launcher.Load(in.Args, getenv); err != nil {
		t.Fatalf("launcher with Istio's env and args %q: %v", in.Args, err)
	}
	return rc
}

// understood are the env vars some role reads: every "env NAME" its -h lists, and
// every ISTIO_META_* (the launcher passes each on as node metadata, as Istio's agent).
func understood(t *testing.T, env map[string]string) map[string]bool {
	t.Helper()
	out := map[string]bool{istioenv.Env: true}
	for k := range env {
		if strings.HasPrefix(k, "ISTIO_META_") {
			out[k] = true
		}
	}
	re := regexp.MustCompile(`\tenv ([A-Z0-9_]+),`)
	for _, role := range podOrder {
		var b strings.Builder
		if !flagenv.PrintHelp(run(t.Context(), []string{role, "-h"}, noEnv), &b) {
			t.Fatalf("%s -h printed no help", role)
		}
		for _, m := range re.FindAllStringSubmatch(b.String(), -1) {
			out[m[1]] = true
		}
	}
	return out
}

// ignoredInDocs is docs/istio.md's table of Istio env vars meshagent ignores.
func ignoredInDocs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/istio.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## Istio's environment meshagent ignores")
	if !ok {
		t.Fatal(`docs/istio.md lacks "## Istio's environment meshagent ignores"`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	out := map[string]string{}
	row := regexp.MustCompile("(?m)^\\| `([A-Z0-9_]+)` \\| (.+) \\|$")
	for _, m := range row.FindAllStringSubmatch(sec, -1) {
		out[m[1]] = m[2]
	}
	if len(out) == 0 {
		t.Fatal("docs/istio.md's ignored table has no rows")
	}
	return out
}

// TestIstioInjectedEnvIsReadOrListedAsIgnored: every variable Istio's injection
// templates set is read by a pod role or listed in docs/istio.md as ignored, with
// why, never both; and the table lists nothing the templates do not set.
func TestIstioInjectedEnvIsReadOrListedAsIgnored(t *testing.T) {
	ignored := ignoredInDocs(t)
	given := map[string]bool{}
	for kind, in := range loadInjected(t) {
		read := understood(t, in.Env)
		for k := range in.Env {
			given[k] = true
			switch {
			case read[k] && ignored[k] != "":
				t.Errorf("%s (%s): read by a role, yet docs/istio.md lists it as ignored", k, kind)
			case !read[k] && ignored[k] == "":
				t.Errorf("%s (%s): neither read by a role nor listed in docs/istio.md as ignored", k, kind)
			}
		}
	}
	var extra []string
	for k := range ignored {
		if !given[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("docs/istio.md lists %v as ignored, which the fixture does not set", extra)
	}
}

// TestIstioInjectedSidecarBehavesAsTheTemplateIntends: the three roles loaded
// with exactly the sidecar's injected env and args (the pod root aside) take the
// key algorithm, the signer, the drain, the status port, the discovery address and
// every other knob the template sets; each variable read has its check here.
func TestIstioInjectedSidecarBehavesAsTheTemplateIntends(t *testing.T) {
	in := loadInjected(t)["sidecar"]
	c := loadRoles(t, in)
	checks := map[string]func() bool{
		"PILOT_CERT_PROVIDER": func() bool { return c.relay.Upstream.CertProvider == "istiod" && c.relay.Upstream.RootCA == "" },
		"CA_ADDR":             func() bool { return c.sds.CA.Addr == "istiod.istio-system.svc:15012" && !c.sds.CA.Plaintext },
		"POD_NAME": func() bool {
			return c.sds.PodRef().Name == "web-7d4f9" && c.relay.PodRef().Name == "web-7d4f9" && c.launcher.PodRef().Name == "web-7d4f9"
		},
		"POD_NAMESPACE": func() bool {
			return c.sds.PodRef().Namespace == "shop" && c.relay.PodRef().Namespace == "shop" && c.launcher.PodRef().Namespace == "shop"
		},
		"INSTANCE_IP":     func() bool { return slices.Equal(c.launcher.Pod.IPs, []string{"10.244.1.17"}) },
		"SERVICE_ACCOUNT": func() bool { return c.sds.Pod.ServiceAccount == "web" && c.launcher.Pod.ServiceAccount == "web" },
		"PROXY_CONFIG": func() bool {
			return c.relay.Upstream.Address == "istiod.istio-system.svc:15012" && c.launcher.Listen.Status == ":15020" &&
				c.launcher.Envoy.AdminAddr == "127.0.0.1:15000" && c.launcher.Envoy.DrainDuration == 45*time.Second &&
				c.launcher.Drain.Duration == 5*time.Second && c.launcher.Envoy.Binary == "/usr/local/bin/envoy" &&
				c.relay.Upstream.Mode == "mtls" // controlPlaneAuthPolicy MUTUAL_TLS
		},
		"ISTIO_META_CLUSTER_ID":   func() bool { return c.launcher.Pod.ClusterID == "Kubernetes" },
		"ISTIO_META_MESH_ID":      func() bool { return c.launcher.Pod.MeshID == "cluster.local" },
		"TRUST_DOMAIN":            func() bool { return c.sds.Pod.TrustDomain == "cluster.local" },
		"ECC_SIGNATURE_ALGORITHM": func() bool { return c.sds.Cert.KeyAlg == pki.ECP384 },
		"ECC_CURVE":               func() bool { return c.sds.Cert.KeyAlg == pki.ECP384 },
		"ISTIO_META_CERT_SIGNER":  func() bool { return c.sds.Cert.Signer == "partner" },
		"ISTIO_META_DNS_CAPTURE":  func() bool { return c.relay.DNS.Capture && c.relay.DNS.Namespace == "shop" },
		"ISTIO_KUBE_APP_PROBERS":  func() bool { return strings.Contains(c.launcher.Status.AppProbers, "/app-health/web/readyz") },
		// The sidecar's args pass the legacy --concurrency 2, which wins over the
		// CPU limit in pilot-agent too; the gateway below has no such arg.
		"ISTIO_CPU_LIMIT": func() bool { return c.launcher.Envoy.Concurrency == 2 },
		"ISTIO_PROMETHEUS_ANNOTATIONS": func() bool {
			return c.launcher.Status.AppMetricsURL == "http://localhost:8080/metrics"
		},
	}
	read := understood(t, in.Env)
	for k := range in.Env {
		if !read[k] {
			continue
		}
		check, ok := checks[k]
		if name, meta := strings.CutPrefix(k, "ISTIO_META_"); meta {
			// Every ISTIO_META_* is node metadata as well as whatever else it does.
			if got := c.launcher.Pod.Meta[name]; got != in.Env[k] {
				t.Errorf("%s=%q: node metadata %s = %q", k, in.Env[k], name, got)
			}
			if !ok {
				continue
			}
		}
		if !ok {
			t.Errorf("%s is read by a role but this test does not check its effect", k)
			continue
		}
		if !check() {
			t.Errorf("%s=%q did not take effect", k, in.Env[k])
		}
	}
	// pilot-agent's own args: the proxy type, the node's domain, Envoy's log levels
	// and concurrency.
	l := c.launcher
	if l.Pod.Type != "sidecar" || l.Pod.DNSDomain != "shop.svc.cluster.local" || l.Envoy.LogLevel != "warning" ||
		l.Envoy.ComponentLevel != "misc:error" || l.Envoy.Concurrency != 2 {
		t.Errorf("args %q: type %q domain %q levels %q %q concurrency %d", in.Args, l.Pod.Type, l.Pod.DNSDomain, l.Envoy.LogLevel,
			l.Envoy.ComponentLevel, l.Envoy.Concurrency)
	}
}

// TestIstioInjectedGatewayBehavesAsTheTemplateIntends: the gateway template's
// `proxy router` runs the launcher as a router, with the same env as a sidecar.
func TestIstioInjectedGatewayBehavesAsTheTemplateIntends(t *testing.T) {
	c := loadRoles(t, loadInjected(t)["gateway"])
	if c.launcher.Pod.Type != "router" || c.launcher.PodRef().String() != "shop/ingress-5c9b8" || c.sds.Pod.ServiceAccount != "ingress" ||
		c.sds.Cert.KeyAlg != pki.ECP256 || c.relay.Upstream.Address != "istiod.istio-system.svc:15012" || c.launcher.Drain.Duration != 5*time.Second ||
		c.launcher.Envoy.Concurrency != 4 {
		t.Fatalf("gateway: type %q pod %s sa %q key %s discovery %q drain %s concurrency %d (ISTIO_CPU_LIMIT 4)", c.launcher.Pod.Type, c.launcher.PodRef(),
			c.sds.Pod.ServiceAccount, c.sds.Cert.KeyAlg, c.relay.Upstream.Address, c.launcher.Drain.Duration, c.launcher.Envoy.Concurrency)
	}
}

// `meshagent proxy sidecar <flags>` (how Istio's template runs istio-proxy) is the
// pod mode with the launcher taking pilot-agent's arguments: a role's error, not
// an unknown role.
func TestProxyCommandIsThePodMode(t *testing.T) {
	err := run(t.Context(), []string{"proxy", "sidecar", "--domain", "shop.svc.cluster.local", "--proxyLogLevel=nope-level"}, noEnv)
	if err == nil || strings.Contains(err.Error(), "unknown role") {
		t.Fatalf("meshagent proxy sidecar: %v", err)
	}
	if !strings.HasPrefix(err.Error(), "sds-edge: ") && !strings.HasPrefix(err.Error(), "xds-relay: ") && !strings.HasPrefix(err.Error(), "launcher: ") {
		t.Fatalf("meshagent proxy sidecar: %v, want a role's error", err)
	}
	err = run(t.Context(), []string{"proxy", "gateway"}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "want `meshagent proxy sidecar` or `meshagent proxy router`") {
		t.Fatalf("meshagent proxy gateway: %v", err)
	}
}
