// Package inject adds meshagent's per-pod services (sds-edge, xds-relay, launcher)
// to a workload, the way `istioctl kube-inject` does: it renders the sidecar
// template for the workload's pod, decodes the result strictly, and adds its init
// containers and volumes to the pod spec.
package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/deploy/kubernetes/internal/strict"
)

// Values are the settings of the template that are the same for every pod.
type Values struct {
	Hub              string // image registry and prefix: <Hub>/sds-edge:<Tag>
	Tag              string
	NATSURL          string // the bus's client URLs, comma-separated
	TrustDomain      string
	DiscoveryAddress string // xds-relay's upstream; a pod overrides it with annotation meshagent.io/discovery-address
	SecretTTL        string
	// CAFallbackAddr is sds-edge's CA_FALLBACK_ADDR: the signers' Istio gRPC CA API,
	// asked when the bus is unreachable or no signer answers on it in time; "" for none.
	CAFallbackAddr string
	// Bus is how pods reach the bus unless their annotation BusAnnotation says
	// otherwise: BusDirect (NATSURL, each pod admitted by the hub) or BusNode
	// (NodeBusURL, through their node's agent).
	Bus string
	// NodeBusURL is the node tier's URL: the node agent of the pod's own node.
	NodeBusURL string
}

// DefaultValues fit deploy/kubernetes/base.
func DefaultValues() Values {
	return Values{
		Hub: "meshagent", Tag: "dev",
		NATSURL:          "tls://nats-0.nats.meshagent-system.svc:4222,tls://nats-1.nats.meshagent-system.svc:4222,tls://nats-2.nats.meshagent-system.svc:4222",
		TrustDomain:      "cluster.local",
		DiscoveryAddress: "istiod.istio-system.svc:15012",
		SecretTTL:        "24h",
		// base/signer.yaml's Service meshagent-ca: every signer replica behind one
		// name its gRPC certificate carries (GRPC_DNS_NAMES); NetworkPolicy signer
		// lets injected pods reach it.
		CAFallbackAddr: "meshagent-ca.meshagent-system.svc:15012",
		Bus:            BusDirect,
		// base/node-agent.yaml's Service meshagent-node, internalTrafficPolicy
		// Local: each pod reaches the agent of its own node, never another's.
		NodeBusURL: "nats://meshagent-node.meshagent-system.svc:4223",
	}
}

// How a pod reaches the bus: annotation BusAnnotation on the pod (or its
// template), over Values.Bus.
const (
	BusAnnotation = "meshagent.io/bus"
	// BusDirect connects each of the pod's services to the hub (NATSURL), admitted
	// there one connection at a time: for small fleets.
	BusDirect = "direct"
	// BusNode connects them to the node agent of the pod's node (NodeBusURL), and
	// sds-edge signs on its node's sign subject (BUS_VIA_NODE): the hub holds one
	// connection per node (docs/kubernetes.md, "The node tier").
	BusNode = "node"
)

// busOf is how pod reaches the bus, or an error for a value that names no way.
func busOf(pod *corev1.Pod, v Values) (string, error) {
	bus := v.Bus
	if a, ok := pod.Annotations[BusAnnotation]; ok {
		bus = a
	}
	switch bus {
	case BusDirect, BusNode:
		return bus, nil
	case "":
		return BusDirect, nil
	}
	return "", fmt.Errorf("pod %s: %s %q: want %q or %q", pod.Name, BusAnnotation, bus, BusDirect, BusNode)
}

// MeshLabel marks an injected pod (value MeshLabelValue): the NetworkPolicies of
// deploy/kubernetes/base let pods with it, and no others, reach the bus's client
// port and the CA's gRPC port.
const (
	MeshLabel      = "meshagent.io/sidecar"
	MeshLabelValue = "injected"
)

// Sidecar is what the template adds to a pod.
type Sidecar struct {
	InitContainers []corev1.Container `json:"initContainers"`
	Volumes        []corev1.Volume    `json:"volumes"`
}

var funcs = template.FuncMap{
	// quote makes a YAML double-quoted scalar (JSON string syntax is valid YAML).
	"quote": func(s string) (string, error) {
		b, err := json.Marshal(s)
		return string(b), err
	},
	"default": func(def, v string) string {
		if v == "" {
			return def
		}
		return v
	},
}

// Render renders tmpl for pod and decodes it strictly: an unknown field is an error.
func Render(tmpl string, pod *corev1.Pod, v Values) (Sidecar, error) {
	t, err := template.New("sidecar").Funcs(funcs).Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return Sidecar{}, fmt.Errorf("sidecar template: %w", err)
	}
	var buf bytes.Buffer
	bus, err := busOf(pod, v)
	if err != nil {
		return Sidecar{}, err
	}
	if bus == BusNode && v.NodeBusURL == "" {
		return Sidecar{}, fmt.Errorf("pod %s: on the node tier, but no node bus URL", pod.Name)
	}
	if err := t.Execute(&buf, map[string]any{"Pod": pod, "Values": v, "Bus": bus}); err != nil {
		return Sidecar{}, fmt.Errorf("sidecar template: %w", err)
	}
	var sc Sidecar
	if err := strict.Unmarshal(buf.Bytes(), &sc); err != nil {
		return Sidecar{}, fmt.Errorf("sidecar template output: %w", err)
	}
	if len(sc.InitContainers) == 0 {
		return Sidecar{}, errors.New("sidecar template output: no containers")
	}
	return sc, nil
}

// InjectPod adds the sidecar to pod, in place, and labels it MeshLabel. A pod that
// already has a container or volume of the same name is refused (injected twice,
// or a clash).
func InjectPod(tmpl string, pod *corev1.Pod, v Values) error {
	sc, err := Render(tmpl, pod, v)
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		names[c.Name] = true
	}
	vols := map[string]bool{}
	for _, vol := range pod.Spec.Volumes {
		vols[vol.Name] = true
	}
	for _, c := range sc.InitContainers {
		if names[c.Name] {
			return fmt.Errorf("pod %s already has a container %q (injected already?)", pod.Name, c.Name)
		}
	}
	for _, vol := range sc.Volumes {
		if vols[vol.Name] {
			return fmt.Errorf("pod %s already has a volume %q (injected already?)", pod.Name, vol.Name)
		}
	}
	// The sidecars go first: the workload's own init containers may need the mesh.
	pod.Spec.InitContainers = append(sc.InitContainers, pod.Spec.InitContainers...)
	pod.Spec.Volumes = append(pod.Spec.Volumes, sc.Volumes...)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[MeshLabel] = MeshLabelValue
	return nil
}

// Inject adds the sidecar to one object: a Pod or the pod template of a Deployment,
// StatefulSet, DaemonSet or Job, given as YAML or JSON. It returns the object as YAML.
func Inject(tmpl string, doc []byte, v Values) ([]byte, error) {
	var meta struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	var obj any
	var tpl *corev1.PodTemplateSpec
	var namespace string
	switch meta.Kind {
	case "Pod":
		var p corev1.Pod
		if err := strict.Unmarshal(doc, &p); err != nil {
			return nil, fmt.Errorf("decode Pod: %w", err)
		}
		if err := InjectPod(tmpl, &p, v); err != nil {
			return nil, err
		}
		return yaml.Marshal(&p)
	case "Deployment":
		var d appsv1.Deployment
		obj, tpl, namespace = &d, &d.Spec.Template, ""
		if err := strict.Unmarshal(doc, &d); err != nil {
			return nil, fmt.Errorf("decode Deployment: %w", err)
		}
		namespace = d.Namespace
	case "StatefulSet":
		var s appsv1.StatefulSet
		obj, tpl = &s, &s.Spec.Template
		if err := strict.Unmarshal(doc, &s); err != nil {
			return nil, fmt.Errorf("StatefulSet: %w", err)
		}
		namespace = s.Namespace
	case "DaemonSet":
		var s appsv1.DaemonSet
		obj, tpl = &s, &s.Spec.Template
		if err := strict.Unmarshal(doc, &s); err != nil {
			return nil, fmt.Errorf("DaemonSet: %w", err)
		}
		namespace = s.Namespace
	case "Job":
		var j batchv1.Job
		obj, tpl = &j, &j.Spec.Template
		if err := strict.Unmarshal(doc, &j); err != nil {
			return nil, fmt.Errorf("decode Job: %w", err)
		}
		namespace = j.Namespace
	default:
		return doc, nil // not a workload: passed through unchanged
	}
	pod := &corev1.Pod{ObjectMeta: tpl.ObjectMeta, Spec: tpl.Spec}
	if pod.Namespace == "" {
		pod.Namespace = namespace
	}
	if err := InjectPod(tmpl, pod, v); err != nil {
		return nil, err
	}
	tpl.Spec, tpl.Labels = pod.Spec, pod.Labels
	return yaml.Marshal(obj)
}
