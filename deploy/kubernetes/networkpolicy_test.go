package kubernetes_test

import (
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	kubernetes "github.com/meshagent/meshagent/deploy/kubernetes"
	"github.com/meshagent/meshagent/deploy/kubernetes/inject"
	"github.com/meshagent/meshagent/deploy/kubernetes/internal/strict"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// peer is a pod that opens a connection.
type peer struct {
	name      string
	namespace string
	labels    map[string]string
}

// reaches reports whether src may open a TCP connection to dst's container port
// named port under policies, as the NetworkPolicy API defines it: a pod selected by
// an Ingress policy takes only what one of those policies' rules allows; a pod no
// policy selects takes everything.
func reaches(t *testing.T, policies []*networkingv1.NetworkPolicy, src peer, dst *workload, port string) bool {
	t.Helper()
	num := int32(-1)
	for _, ct := range dst.spec.Containers {
		for _, p := range ct.Ports {
			if p.Name == port {
				num = p.ContainerPort
			}
		}
	}
	if num < 0 {
		t.Fatalf("%s declares no port %s", dst.name, port)
	}
	selects := func(s *metav1.LabelSelector, l map[string]string) bool {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return sel.Matches(labels.Set(l))
	}
	isolated := false
	for _, np := range policies {
		if np.Namespace != dst.namespace || !selects(&np.Spec.PodSelector, dst.labels) {
			continue
		}
		if len(np.Spec.PolicyTypes) > 0 && !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, r := range np.Spec.Ingress {
			portOK := len(r.Ports) == 0
			for _, p := range r.Ports {
				if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
					continue
				}
				if p.Port == nil || p.Port.Type == intstr.String && p.Port.StrVal == port || p.Port.Type == intstr.Int && p.Port.IntVal == num {
					portOK = true
				}
			}
			fromOK := len(r.From) == 0
			for _, f := range r.From {
				if f.IPBlock != nil {
					t.Fatalf("NetworkPolicy/%s: an ipBlock would let any pod in through its address", np.Name)
				}
				nsOK := src.namespace == np.Namespace
				if f.NamespaceSelector != nil {
					nsOK = selects(f.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": src.namespace})
				}
				podOK := f.PodSelector == nil || selects(f.PodSelector, src.labels)
				if nsOK && podOK {
					fromOK = true
				}
			}
			if portOK && fromOK {
				return true
			}
		}
	}
	return !isolated
}

// meshPod is a workload's pod as the injector leaves it.
func meshPod(t *testing.T) peer {
	out, err := inject.Inject(kubernetes.SidecarTemplate, []byte(sampleDeployment), inject.DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := strict.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Template.Labels[inject.MeshLabel] != inject.MeshLabelValue || d.Spec.Template.Labels["app"] != "web" {
		t.Fatalf("injected pod labels %v", d.Spec.Template.Labels)
	}
	return peer{"an injected pod in shop", d.Namespace, d.Spec.Template.Labels}
}

// The bus's client port is for the mesh's pods and the fleet services, its routes
// for the NATS nodes, the CA's gRPC port for the mesh's pods; nothing else in the
// namespace takes a connection.
func TestNetworkPolicies(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*workload{}
	for _, w := range inv.workloads {
		byName[w.name] = w
	}
	nats, signer, rotator := byName["nats"], byName["signer"], byName["rotator"]
	pod := func(w *workload) peer { return peer{w.name, w.namespace, w.labels} }
	mesh := meshPod(t)
	plain := peer{"a pod without the sidecar in shop", "shop", map[string]string{"app": "web"}}
	forged := peer{"a pod in shop labelled as a NATS node", "shop", map[string]string{"app.kubernetes.io/name": "nats"}}
	neighbour := peer{"another pod in meshagent-system", "meshagent-system", map[string]string{"app": "debug"}}
	for _, c := range []struct {
		src  peer
		dst  *workload
		port string
		want bool
	}{
		{mesh, nats, "client", true},
		{pod(signer), nats, "client", true},
		{pod(rotator), nats, "client", true},
		{plain, nats, "client", false},
		{neighbour, nats, "client", false},
		{pod(nats), nats, "cluster", true},
		{mesh, nats, "cluster", false},
		{pod(signer), nats, "cluster", false},
		{forged, nats, "cluster", false},
		{neighbour, nats, "cluster", false},
		{mesh, signer, "grpc-ca", true},
		{plain, signer, "grpc-ca", false},
		{pod(rotator), signer, "grpc-ca", false},
		{neighbour, signer, "grpc-ca", false},
		{plain, signer, "http-monitoring", true},
		{plain, rotator, "http-monitoring", true},
	} {
		if got := reaches(t, inv.policies, c.src, c.dst, c.port); got != c.want {
			t.Errorf("%s -> %s:%s: allowed %v, want %v", c.src.name, c.dst.name, c.port, got, c.want)
		}
	}
	// Every pod of the namespace is selected by an Ingress policy: a port added
	// later is closed until a rule opens it.
	for _, w := range inv.workloads {
		selected := false
		for _, np := range inv.policies {
			sel, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if sel.Matches(labels.Set(w.labels)) && slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
				selected = true
			}
		}
		if !selected {
			t.Errorf("%s: no NetworkPolicy selects it", w.name)
		}
	}
	// On a NATS cluster of one's own, the NATS policy goes with the StatefulSet.
	ext, err := decodeAll(build(t, "external-nats"))
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range ext.policies {
		if np.Name == "nats" {
			t.Error("external-nats keeps a policy for NATS pods it does not run")
		}
	}
}

// NATS monitoring has no authentication: every nats-server listens for it on
// loopback only, declares no port for it, and no Service exposes it.
func TestNATSMonitoringOnLoopback(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, w := range inv.workloads {
		for _, ct := range w.spec.Containers {
			if imageBinary[imageName(ct.Image)] != "nats-server" {
				continue
			}
			n++
			for _, a := range ct.Args {
				if a == "-m" || a == "--http_port" || a == "-ms" || a == "--https_port" || strings.HasPrefix(a, "--http") {
					t.Errorf("%s: arg %s opens monitoring beside the config", w.name, a)
				}
			}
			for _, p := range ct.Ports {
				if p.ContainerPort == 8222 || p.Name == "monitor" {
					t.Errorf("%s declares the monitoring port %+v", w.name, p)
				}
			}
			for kind, p := range map[string]*corev1.Probe{"startup": ct.StartupProbe, "liveness": ct.LivenessProbe, "readiness": ct.ReadinessProbe} {
				if p == nil || p.TCPSocket == nil || p.TCPSocket.Port.StrVal != "client" {
					t.Errorf("%s: %s probe %+v, want the client port (monitoring is out of the kubelet's reach)", w.name, kind, p)
				}
			}
		}
	}
	if n != 1 { // one StatefulSet (of three replicas)
		t.Fatalf("%d nats-server containers", n)
	}
	conf := inv.configMaps["nats-config"].Data["nats.conf"]
	monitors := 0
	for _, line := range strings.Split(conf, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "http", "https":
			monitors++
			host, _, err := net.SplitHostPort(strings.Trim(strings.TrimSpace(val), `"`))
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				t.Errorf("nats.conf %q: monitoring not on loopback", line)
			}
		case "http_port", "https_port", "monitor_port":
			t.Errorf("nats.conf %q: a bare port listens on every address", line)
		}
	}
	if monitors != 1 {
		t.Errorf("%d monitoring listeners in nats.conf", monitors)
	}
	for _, s := range inv.services {
		for _, p := range s.Spec.Ports {
			if p.Port == 8222 || p.TargetPort.StrVal == "monitor" {
				t.Errorf("Service/%s exposes monitoring", s.Name)
			}
		}
	}
}

// The pod's token, its bus credential and CA credential, lives the hour
// docs/security.md reasons with.
func TestSidecarTokenLivesAnHour(t *testing.T) {
	out, err := inject.Inject(kubernetes.SidecarTemplate, []byte(sampleDeployment), inject.DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := strict.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if sat := s.ServiceAccountToken; sat != nil {
				found = true
				if sat.ExpirationSeconds == nil || *sat.ExpirationSeconds != 3600 {
					t.Errorf("token %s: expirationSeconds %v, want 3600", sat.Path, sat.ExpirationSeconds)
				}
			}
		}
	}
	if !found {
		t.Fatal("no projected token")
	}
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "projected token's lifetime (1 h") {
		t.Error("docs/security.md no longer reasons with the 1 h token")
	}
}

// The injected sds-edge's gRPC fallback (CA_FALLBACK_ADDR) is a Service of base
// that selects the signers, on a port that is their CA API, under a name their
// gRPC certificate carries, and NetworkPolicy lets the mesh's pods reach it.
func TestSidecarFallsBackToTheSignersCA(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	var signer *workload
	for _, w := range inv.workloads {
		if w.name == "signer" {
			signer = w
		}
	}
	if signer == nil {
		t.Fatal("no signer in base")
	}
	out, err := inject.Inject(kubernetes.SidecarTemplate, []byte(sampleDeployment), inject.DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := strict.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	var fallback string
	for _, c := range d.Spec.Template.Spec.InitContainers {
		for _, e := range c.Env {
			if c.Name == "sds-edge" && e.Name == "CA_FALLBACK_ADDR" {
				fallback = e.Value
			}
		}
	}
	if fallback == "" {
		t.Fatal("the injected sds-edge has no CA_FALLBACK_ADDR")
	}
	var dnsNames []string
	ports := map[string]int32{}
	for _, c := range signer.spec.Containers {
		for _, e := range c.Env {
			if e.Name == "GRPC_DNS_NAMES" {
				dnsNames = strings.Split(e.Value, ",")
			}
		}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
	}
	for _, addr := range strings.Split(fallback, ",") {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("CA_FALLBACK_ADDR %q: %v", addr, err)
		}
		if !slices.Contains(dnsNames, host) {
			t.Errorf("%s is not a name of the signer's gRPC certificate (GRPC_DNS_NAMES %v): its TLS would not verify", host, dnsNames)
		}
		name, ns, _ := strings.Cut(strings.TrimSuffix(host, ".svc"), ".")
		var target string
		for _, s := range inv.services {
			if s.Name != name || s.Namespace != ns || !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(signer.labels)) {
				continue
			}
			for _, p := range s.Spec.Ports {
				if port == strconv.Itoa(int(p.Port)) {
					target = p.TargetPort.String()
				}
			}
		}
		if target == "" || ports[target] == 0 {
			t.Fatalf("%s: no Service of base selecting the signers on that port (target %q)", addr, target)
		}
		if target != "grpc-ca" {
			t.Errorf("%s reaches the signers' port %s, not their CA API (grpc-ca)", addr, target)
		}
		if !reaches(t, inv.policies, meshPod(t), signer, target) {
			t.Errorf("NetworkPolicy keeps an injected pod from %s", addr)
		}
	}
}
