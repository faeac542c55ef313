package compose

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
)

// nats-server itself loads nats.conf as the compose stack mounts it, with the role
// table compose-secrets renders: the node agents' leaf listener is on 7422 in TLS
// with no credentials of its own, so that the signers' callout admits each leaf
// connection (by the node agent's token) as it admits pods.
func TestNATSConfigLoadsWithTheLeafListener(t *testing.T) {
	dir := t.TempDir()
	creds, err := policy.LoadOrGenerate(filepath.Join(dir, "bus"))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := policy.Render(creds.Keys)
	if err != nil {
		t.Fatal(err)
	}
	cert := testkit.SelfSigned(t, testkit.Spec{DNS: []string{"nats-1"}})
	files := map[string]string{"secrets/nats-auth.conf": auth, "secrets/server-cert.pem": cert.PEM(),
		"secrets/server-key.pem": cert.KeyPEM(t), "secrets/ca.pem": cert.PEM()}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := os.ReadFile("nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer("/etc/nats/secrets/", filepath.Join(dir, "secrets")+"/", `"/data"`, `"`+filepath.Join(dir, "js")+`"`).Replace(string(conf))
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_SERVER_NAME", "nats-1")
	t.Setenv("NATS_ROUTE_ADVERTISE", "nats-1:6222")
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats-server refuses nats.conf: %v", err)
	}
	bustest.RequireHubLeafListener(t, opts)
}
