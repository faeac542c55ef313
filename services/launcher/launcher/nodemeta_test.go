package launcher_test

import (
	"os"
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
