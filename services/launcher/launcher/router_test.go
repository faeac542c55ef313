package launcher_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/launcher/internal/bootstrap"
	"github.com/meshagent/meshagent/tests/testkit"
)

// `proxy router`: Envoy (the stand-in) starts on a gateway's bootstrap — router
// node id, ROUTER_MODE, the gateway credential cluster on sds-edge's credential
// socket.
func TestRouterModeBootstrap(t *testing.T) {
	p := newPod(t)
	p.relayReady.Store(true)
	p.giveSecrets()
	cred := filepath.Join(p.dir, "credential-socket")
	s := p.start(append([]string{"proxy", "router"}, p.args("-credential-socket", cred)...)...)
	event[events.EnvoyStarted](t, p)
	data, err := os.ReadFile(s.cfg.Envoy.BootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(data, &b); err != nil || b.ValidateAll() != nil {
		t.Fatalf("not Envoy's bootstrap: %v, %v", err, b.ValidateAll())
	}
	if id := b.GetNode().GetId(); len(id) < 7 || id[:7] != "router~" || id != s.l.NodeID() {
		t.Fatalf("node id %q", id)
	}
	if m := b.GetNode().GetMetadata().GetFields()["ROUTER_MODE"].GetStringValue(); m != "standard" {
		t.Fatalf("ROUTER_MODE %q", m)
	}
	var path string
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == bootstrap.CredentialCluster {
			path = c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
		}
	}
	if path != cred {
		t.Fatalf("%s cluster socket %q, want %q", bootstrap.CredentialCluster, path, cred)
	}
}

// A gateway drains every listener, not only inbound ones as a sidecar does: its
// outbound-facing listener stops accepting once the drain begins, while Envoy runs
// on for the connection still open (draining to zero connections).
func TestRouterDrainsAllListeners(t *testing.T) {
	dir := testkit.ShortDir(t)
	out := testkit.FreeAddr(t)
	tmpl := filepath.Join(dir, "gateway.tmpl")
	host, port, _ := net.SplitHostPort(out)
	if err := os.WriteFile(tmpl, []byte(`{
  "node": {"id": "{{.NodeID}}", "cluster": "{{.Cluster}}"},
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": {{port .AdminAddr}}}}},
  "static_resources": {"listeners": [{"name": "gateway-443", "traffic_direction": "OUTBOUND",
    "address": {"socket_address": {"address": "`+host+`", "port_value": `+port+`}}}]}
}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newPod(t)
	p.relayReady.Store(true)
	p.giveSecrets()
	s := p.start(append([]string{"proxy", "router"}, p.args("-bootstrap-template", tmpl,
		"-exit-on-zero-active-connections", "-minimum-drain-duration", "0s", "-drain-poll-interval", "20ms")...)...)
	event[events.EnvoyReady](t, p)
	held := holdConnection(t, out)
	s.cancel()
	event[events.EnvoyDraining](t, p)
	testkit.Eventually(t, "the gateway listener to stop accepting", func() bool {
		c, err := net.Dial("tcp", out)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	p.mu.Lock()
	for _, e := range p.seen {
		if _, ok := e.(events.EnvoyExited); ok {
			t.Error("Envoy exited before the drain was seen: the listener closed with it, not by the drain")
		}
	}
	p.mu.Unlock()
	held.Close()
	if err := s.wait(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if x := event[events.EnvoyExited](t, p); x.Drain != events.DrainZeroReached {
		t.Fatalf("exited %+v", x)
	}
}
