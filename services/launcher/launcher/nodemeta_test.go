package launcher_test

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meshagent/meshagent/pkg/events"
)

// Istio's ISTIO_META_* reach Envoy's node metadata as Istio's agent puts them
// there (issue 28): named without the prefix, values as strings (a JSON-valued
// one, POD_PORTS, stays the string Istio keeps it as), PROXY_CONFIG's
// proxyMetadata under the container's own env; the keys the launcher sets from
// its flags keep the flags' values, and an explicit WORKLOAD_NAME wins over the
// one guessed from the app label.
func TestIstioMetaReachesTheNodeMetadata(t *testing.T) {
	p := newPod(t)
	p.env = map[string]string{
		"ISTIO_META_POD_PORTS":      `[{"containerPort":8080,"protocol":"TCP"}]`,
		"ISTIO_META_WORKLOAD_NAME":  "web",
		"ISTIO_META_MY_FILTER_KNOB": "on",
		"ISTIO_META_CLUSTER_ID":     "from-env",
		"ISTIO_METAJSON_LABELS":     `{"app":"web-app"}`,
		"PROXY_CONFIG":              "proxyMetadata:\n  ISTIO_META_FROM_MESH: \"1\"\n  ISTIO_META_MY_FILTER_KNOB: mesh\n",
	}
	p.relayReady.Store(true)
	p.giveSecrets()
	s := p.start(p.args("-cluster-id", "from-flag")...)
	event[events.EnvoyStarted](t, p)
	data, err := os.ReadFile(s.cfg.Envoy.BootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(data, &b); err != nil || b.ValidateAll() != nil {
		t.Fatalf("not Envoy's bootstrap: %v, %v", err, b.ValidateAll())
	}
	md := b.GetNode().GetMetadata().GetFields()
	for k, want := range map[string]string{
		"POD_PORTS":      `[{"containerPort":8080,"protocol":"TCP"}]`,
		"WORKLOAD_NAME":  "web",
		"MY_FILTER_KNOB": "on",
		"FROM_MESH":      "1",
		"CLUSTER_ID":     "from-flag",
		"NAME":           s.cfg.Pod.ID,
	} {
		if got := md[k].GetStringValue(); got != want {
			t.Errorf("node metadata %s = %q, want %q", k, got, want)
		}
	}
	if got := md["LABELS"].GetStructValue().GetFields()["app"].GetStringValue(); got != "web-app" {
		t.Errorf("LABELS.app = %q", got)
	}
}

// The pod's labels file (Istio's injection template mounts the downward API's
// labels at ./etc/istio/pod/labels) reaches the bootstrap as pilot-agent puts it
// there (checked against a real pilot-agent, istio/istio 86c9f01fd73): LABELS
// is ISTIO_METAJSON_LABELS with the file's labels over it, pod-template-hash
// left out, and the node's cluster is the app label dot namespace. Before, LABELS
// held only ISTIO_METAJSON_LABELS and the cluster was istio-proxy.
func TestPodLabelsFileReachesTheBootstrap(t *testing.T) {
	p := newPod(t)
	if err := os.MkdirAll(filepath.Join(p.dir, "etc/istio/pod"), 0o755); err != nil {
		t.Fatal(err)
	}
	labels := "app=\"web\"\npod-template-hash=\"7d4f9\"\nversion=\"v1\"\n"
	if err := os.WriteFile(filepath.Join(p.dir, "etc/istio/pod/labels"), []byte(labels), 0o644); err != nil {
		t.Fatal(err)
	}
	p.env = map[string]string{"ISTIO_METAJSON_LABELS": `{"app":"static","team":"a"}`}
	p.relayReady.Store(true)
	p.giveSecrets()
	s := p.start(p.args()...)
	event[events.EnvoyStarted](t, p)
	data, err := os.ReadFile(s.cfg.Envoy.BootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(data, &b); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for k, v := range b.GetNode().GetMetadata().GetFields()["LABELS"].GetStructValue().GetFields() {
		got[k] = v.GetStringValue()
	}
	if want := map[string]string{"app": "web", "team": "a", "version": "v1"}; !maps.Equal(got, want) {
		t.Errorf("LABELS %v, pilot-agent's %v", got, want)
	}
	if c := b.GetNode().GetCluster(); c != "web.default" {
		t.Errorf("node cluster %q, pilot-agent's web.default", c)
	}
}
