package kubernetes_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kubernetes "github.com/meshagent/meshagent/deploy/kubernetes"
	"github.com/meshagent/meshagent/deploy/kubernetes/inject"
	"github.com/meshagent/meshagent/deploy/kubernetes/internal/strict"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// envOf is a container's env, each value resolved against inv's ConfigMaps, and
// each fieldRef as "fieldRef:<path>".
func envOf(inv *inventory, ct corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range ct.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.ConfigMapKeyRef != nil && inv != nil && inv.configMaps[e.ValueFrom.ConfigMapKeyRef.Name] != nil:
			env[e.Name] = inv.configMaps[e.ValueFrom.ConfigMapKeyRef.Name].Data[e.ValueFrom.ConfigMapKeyRef.Key]
		}
	}
	return env
}

func portNamed(spec corev1.PodSpec, name string) int32 {
	for _, ct := range spec.Containers {
		for _, p := range ct.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
	}
	return -1
}

// nodeTierProblems checks what ties the node tier together in one overlay: the
// DaemonSet runs as the account the signer admits leaf connections of, with a
// token for the signer's audience and its node's name; it dials the hub's leaf
// listener (in TLS, a Service of the NATS pods on their leafnodes port, when the
// overlay runs NATS); its pods' port is the one the injector's node URL reaches,
// through a Service that keeps a pod on its own node.
func nodeTierProblems(inv *inventory) []string {
	var p []string
	addf := func(format string, a ...any) { p = append(p, fmt.Sprintf(format, a...)) }
	var agent, signer, nats *workload
	for _, w := range inv.workloads {
		switch w.kind + "/" + w.name {
		case "DaemonSet/node-agent":
			agent = w
		case "Deployment/signer":
			signer = w
		case "StatefulSet/nats":
			nats = w
		}
	}
	if agent == nil || signer == nil {
		return []string{fmt.Sprintf("no node-agent DaemonSet (%v) or no signer (%v)", agent != nil, signer != nil)}
	}
	a, s := envOf(inv, agent.spec.Containers[0]), envOf(inv, signer.spec.Containers[0])

	// The hub admits the agent's leaf connection by its token: that account, that audience.
	if want := agent.namespace + "/" + agent.spec.ServiceAccountName; !strings.Contains(","+s["NODE_AGENT_ACCOUNTS"]+",", ","+want+",") {
		addf("signer NODE_AGENT_ACCOUNTS %q names no %s, the node agents' account: the hub refuses every node", s["NODE_AGENT_ACCOUNTS"], want)
	}
	if !inv.serviceAccounts[agent.spec.ServiceAccountName] {
		addf("node agent's ServiceAccount %s is not in the manifests", agent.spec.ServiceAccountName)
	}
	if a["TOKEN_AUDIENCE"] != s["TOKEN_AUDIENCE"] {
		addf("node agent verifies pods' tokens for audience %q, the signer for %q", a["TOKEN_AUDIENCE"], s["TOKEN_AUDIENCE"])
	}
	tokenFile := a["NODE_TOKEN_FILE"]
	found := false
	for _, v := range agent.spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			sat := src.ServiceAccountToken
			if sat == nil {
				continue
			}
			for _, m := range agent.spec.Containers[0].VolumeMounts {
				if m.Name == v.Name && strings.TrimSuffix(m.MountPath, "/")+"/"+sat.Path == tokenFile {
					found = true
					if sat.Audience != s["TOKEN_AUDIENCE"] {
						addf("node agent's token has audience %q; the signer admits %q", sat.Audience, s["TOKEN_AUDIENCE"])
					}
					if sat.ExpirationSeconds == nil || *sat.ExpirationSeconds > 3600 {
						addf("node agent's token lives %v s, longer than a pod's hour", sat.ExpirationSeconds)
					}
				}
			}
		}
	}
	if !found {
		addf("NODE_TOKEN_FILE %q is no projected service-account token of the node agent", tokenFile)
	}
	if a["NODE_NAME"] != "fieldRef:spec.nodeName" {
		addf("node agent NODE_NAME %q: want the downward API's spec.nodeName, the name pods' tokens carry", a["NODE_NAME"])
	}

	// The hub's leaf listener, in TLS.
	hub, err := url.Parse(a["MESHAGENT_HUB_URL"])
	if err != nil || hub.Scheme != "tls" || a["MESHAGENT_HUB_CA"] == "" {
		addf("node agent MESHAGENT_HUB_URL %q (CA %q): want tls:// with the bus CA", a["MESHAGENT_HUB_URL"], a["MESHAGENT_HUB_CA"])
	} else if nats != nil {
		name, ns, _ := strings.Cut(strings.TrimSuffix(hub.Hostname(), ".svc"), ".")
		ok := false
		for _, svc := range inv.services {
			if svc.Name != name || svc.Namespace != ns || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(nats.labels)) {
				continue
			}
			for _, sp := range svc.Spec.Ports {
				if fmt.Sprint(sp.Port) == hub.Port() && sp.TargetPort.StrVal == "leafnodes" && portNamed(nats.spec, "leafnodes") == leafListenPort(inv) {
					ok = true
				}
			}
		}
		if !ok {
			addf("node agent dials %s: not the leaf node listener of a Service of the NATS pods", hub.Host)
		}
	}

	// The pods' side: the agent listens on every address, on its declared port,
	// reached through a node-local Service on the port the injector's URL names.
	_, listen, err := net.SplitHostPort(a["NODE_BUS_ADDR"])
	if err != nil || fmt.Sprint(portNamed(agent.spec, "nats-pods")) != listen {
		addf("node agent NODE_BUS_ADDR %q: no containerPort nats-pods for it", a["NODE_BUS_ADDR"])
	}
	nodeURL, _ := url.Parse(inject.DefaultValues().NodeBusURL)
	name, ns, _ := strings.Cut(strings.TrimSuffix(nodeURL.Hostname(), ".svc"), ".")
	var svc *corev1.Service
	for _, x := range inv.services {
		if x.Name == name && x.Namespace == ns {
			svc = x
		}
	}
	switch {
	case svc == nil:
		addf("the injector's node URL %s names no Service", nodeURL)
	case !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(agent.labels)):
		addf("Service/%s does not select the node agents", svc.Name)
	case svc.Spec.InternalTrafficPolicy == nil || *svc.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal:
		addf("Service/%s is not internalTrafficPolicy Local: a pod may reach another node's agent, which refuses it, and its token leaves its node", svc.Name)
	default:
		ok := false
		for _, sp := range svc.Spec.Ports {
			ok = ok || fmt.Sprint(sp.Port) == nodeURL.Port() && sp.TargetPort.StrVal == "nats-pods"
		}
		if !ok {
			addf("Service/%s has no port %s to the agents' nats-pods", svc.Name, nodeURL.Port())
		}
	}
	if agent.spec.Containers[0].ReadinessProbe == nil || agent.spec.Containers[0].ReadinessProbe.HTTPGet == nil ||
		agent.spec.Containers[0].ReadinessProbe.HTTPGet.Path != "/readyz" {
		addf("node agent's readiness is not its /readyz (ready once connected to the hub)")
	}
	return p
}

// leafListenPort is the port of nats.conf's leafnodes listener, -1 without one.
func leafListenPort(inv *inventory) int32 {
	m, err := parseNATSConf(inv)
	if err != nil {
		return -1
	}
	leaf, _ := m["leafnodes"].(map[string]any)
	_, port, err := net.SplitHostPort(fmt.Sprint(leaf["listen"]))
	if err != nil {
		return -1
	}
	return atoi32(port)
}

// parseNATSConf parses the NATS ConfigMap's nats.conf with nats-server's own
// parser, without its include (a file the operator makes).
func parseNATSConf(inv *inventory) (map[string]any, error) {
	cm := inv.configMaps["nats-config"]
	if cm == nil {
		return nil, fmt.Errorf("no nats-config")
	}
	text := strings.ReplaceAll(cm.Data["nats.conf"], "include auth/nats-auth.conf", "")
	return conf.Parse(strings.ReplaceAll(text, "$POD_NAME", "nats-0"))
}

// leafListenerProblems checks the hub's leafnodes block: a listener in TLS, and no
// authorization of its own (which would take leaf connections away from the
// callout, and the node's permissions with them).
func leafListenerProblems(inv *inventory) []string {
	m, err := parseNATSConf(inv)
	if err != nil {
		return []string{"nats.conf: " + err.Error()}
	}
	leaf, ok := m["leafnodes"].(map[string]any)
	if !ok {
		return []string{"nats.conf has no leafnodes block: node agents have nothing to connect to"}
	}
	var p []string
	if fmt.Sprint(leaf["listen"]) != "0.0.0.0:7422" {
		p = append(p, fmt.Sprintf("leafnodes listen %v, want 0.0.0.0:7422", leaf["listen"]))
	}
	if tls, _ := leaf["tls"].(map[string]any); tls == nil || tls["cert_file"] != "/etc/nats/tls/tls.crt" || tls["key_file"] != "/etc/nats/tls/tls.key" {
		p = append(p, fmt.Sprintf("leafnodes tls %v: node tokens would cross the network in plaintext", leaf["tls"]))
	}
	if _, ok := leaf["authorization"]; ok {
		p = append(p, "leafnodes has an authorization block: leaf connections would skip the signer's callout")
	}
	if _, ok := leaf["remotes"]; ok {
		p = append(p, "the hub solicits leaf connections (remotes)")
	}
	return p
}

func TestNodeTier(t *testing.T) {
	for _, dir := range []string{"base", "external-nats", "token-review"} {
		t.Run(dir, func(t *testing.T) {
			inv, err := decodeAll(build(t, dir))
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range nodeTierProblems(inv) {
				t.Error(p)
			}
			if dir != "external-nats" {
				for _, p := range leafListenerProblems(inv) {
					t.Error(p)
				}
			}
		})
	}
}

// The node-tier checks catch what they are for: each mutation of base is reported.
func TestNodeTierChecksCatchMismatches(t *testing.T) {
	base := string(build(t, "base"))
	for _, tt := range []struct{ name, from, to, want string }{
		{"signer admits another account", "value: meshagent-system/meshagent-node", "value: meshagent-system/node-agent", "names no meshagent-system/meshagent-node"},
		{"token for another audience", "audience: istio-ca\n              expirationSeconds: 3600\n              path: meshagent-node", "audience: nats\n              expirationSeconds: 3600\n              path: meshagent-node", "has audience \"nats\""},
		{"token a day long", "expirationSeconds: 3600\n              path: meshagent-node", "expirationSeconds: 86400\n              path: meshagent-node", "longer than a pod's hour"},
		{"node name from the pod name", "fieldPath: spec.nodeName", "fieldPath: metadata.name", "NODE_NAME \"fieldRef:metadata.name\""},
		{"hub on the client port", "hub-leaf-url: tls://nats.meshagent-system.svc:7422", "hub-leaf-url: tls://nats.meshagent-system.svc:4222", "not the leaf node listener"},
		{"hub in plaintext", "hub-leaf-url: tls://", "hub-leaf-url: nats://", "want tls://"},
		{"pods' Service across nodes", "internalTrafficPolicy: Local", "internalTrafficPolicy: Cluster", "another node's agent"},
		{"agent on another port", "value: 0.0.0.0:4223", "value: 0.0.0.0:4224", "no containerPort nats-pods"},
		{"leaf listener with its own authorization", "no_advertise: true", "no_advertise: true\n      authorization { user: leaf, password: x }", "skip the signer's callout"},
		{"leaf listener in plaintext", "      tls {\n        cert_file: /etc/nats/tls/tls.crt\n        key_file: /etc/nats/tls/tls.key\n        timeout: 2\n      }\n    }\n    include", "    }\n    include", "in plaintext"},
		{"no leaf listener", "leafnodes {", "leafnodez {", "no leafnodes block"},
		{"hostPort for the pods", "- containerPort: 4223\n", "- containerPort: 4223\n          hostPort: 4223\n", "hostPort 4223: Pod Security baseline"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(base, tt.from) {
				t.Fatalf("base has no %q", tt.from)
			}
			inv, err := decodeAll([]byte(strings.Replace(base, tt.from, tt.to, 1)))
			if err != nil {
				t.Fatal(err)
			}
			problems := append(nodeTierProblems(inv), leafListenerProblems(inv)...)
			c := &checker{bins: bindings(t), inv: inv}
			for _, w := range inv.workloads {
				c.restrictedPod(w.kind+"/"+w.name, w.spec)
			}
			problems = append(problems, c.problems...)
			if !strings.Contains(strings.Join(problems, "\n"), tt.want) {
				t.Fatalf("not reported (%q); problems: %v", tt.want, problems)
			}
		})
	}
}

// injectedSpec is sampleDeployment's pod spec once injected with v and, when bus is
// not empty, annotated meshagent.io/bus=bus.
func injectedSpec(t *testing.T, v inject.Values, bus string) (*appsv1.Deployment, error) {
	t.Helper()
	doc := sampleDeployment
	if bus != "" {
		doc = strings.Replace(doc, "      annotations:\n", "      annotations:\n        meshagent.io/bus: "+bus+"\n", 1)
	}
	out, err := inject.Inject(kubernetes.SidecarTemplate, []byte(doc), v)
	if err != nil {
		return nil, err
	}
	var d appsv1.Deployment
	if err := strict.Unmarshal(out, &d); err != nil {
		t.Fatalf("injected Deployment does not decode strictly: %v\n%s", err, out)
	}
	return &d, nil
}

// A pod annotated meshagent.io/bus=node (or injected with -bus node) reaches the
// bus through its node's agent: every bus client of the pod on the node URL, in
// plaintext on the node (no bus CA), and sds-edge signing through its node.
// Direct stays the default, and an annotation wins over the flag.
func TestSidecarOnTheNodeTier(t *testing.T) {
	v := inject.DefaultValues()
	nodeFlag := v
	nodeFlag.Bus = inject.BusNode
	for _, tt := range []struct {
		name     string
		v        inject.Values
		bus      string
		wantNode bool
	}{
		{"default", v, "", false},
		{"annotated node", v, "node", true},
		{"injected with -bus node", nodeFlag, "", true},
		{"annotated direct over -bus node", nodeFlag, "direct", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := injectedSpec(t, tt.v, tt.bus)
			if err != nil {
				t.Fatal(err)
			}
			spec := d.Spec.Template.Spec
			c := &checker{bins: bindings(t)}
			c.workload(&workload{kind: "Deployment", name: d.Name, namespace: d.Namespace, labels: d.Spec.Template.Labels, spec: spec})
			for _, p := range c.problems {
				t.Error(p)
			}
			for _, ct := range spec.InitContainers[:3] {
				env := envOf(nil, ct)
				wantURL, wantCA, wantVia := v.NATSURL, "/var/run/secrets/meshagent/bus-ca/ca.crt", ""
				if tt.wantNode {
					wantURL, wantCA = v.NodeBusURL, ""
					if ct.Name == "sds-edge" {
						wantVia = "fieldRef:spec.nodeName"
					}
				}
				if env["NATS_URL"] != wantURL || env["NATS_TLS_CA"] != wantCA || env["BUS_VIA_NODE"] != wantVia {
					t.Errorf("%s: NATS_URL %q NATS_TLS_CA %q BUS_VIA_NODE %q; want %q %q %q", ct.Name,
						env["NATS_URL"], env["NATS_TLS_CA"], env["BUS_VIA_NODE"], wantURL, wantCA, wantVia)
				}
			}
			hasCA := false
			for _, vol := range spec.Volumes {
				hasCA = hasCA || vol.Name == "meshagent-bus-ca"
			}
			if hasCA == tt.wantNode {
				t.Errorf("bus CA volume present %v on the node tier %v", hasCA, tt.wantNode)
			}
		})
	}
	// A value that names no way to the bus is refused, not taken for direct.
	for _, bad := range []string{"nodes", "Node"} {
		if _, err := injectedSpec(t, v, bad); err == nil || !strings.Contains(err.Error(), "meshagent.io/bus") {
			t.Errorf("annotation %q: %v", bad, err)
		}
	}
	bad := v
	bad.Bus = "hub"
	if _, err := injectedSpec(t, bad, ""); err == nil {
		t.Error("-bus hub accepted")
	}
}

// nats-server itself loads base's nats.conf with the role table `meshctl bus-auth`
// renders (its include) and certificate files where the Secret puts them: the leaf
// listener is on 7422 in TLS with no credentials of its own, beside the auth
// callout that therefore admits leaf connections.
func TestNATSConfigLoadsInNATSServer(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	creds, err := policy.LoadOrGenerate(filepath.Join(dir, "bus"))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := policy.Render(creds.Keys)
	if err != nil {
		t.Fatal(err)
	}
	cert := testkit.SelfSigned(t, testkit.Spec{DNS: []string{"nats.meshagent-system.svc"}})
	files := map[string]string{"auth/nats-auth.conf": auth, "tls/tls.crt": cert.PEM(), "tls/tls.key": cert.KeyPEM(t), "tls/ca.crt": cert.PEM()}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	text := strings.NewReplacer("/etc/nats/tls/", filepath.Join(dir, "tls")+"/", "/data/jetstream", filepath.Join(dir, "js")).
		Replace(inv.configMaps["nats-config"].Data["nats.conf"])
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAME", "nats-0")
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats-server refuses base's nats.conf: %v", err)
	}
	bustest.RequireHubLeafListener(t, opts)
}
