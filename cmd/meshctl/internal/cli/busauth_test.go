package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/nats-io/nats-server/v2/server"
)

func TestBusAuthWritesAConfigNATSServerLoads(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, "bus-auth", "-out", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	conf := filepath.Join(dir, "nats-auth.conf")
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server rejects the config: %v", err)
	}
	if opts.AuthCallout == nil || len(opts.AuthCallout.AuthUsers) != len(policy.Users) || len(opts.Nkeys) != len(policy.Users) {
		t.Fatalf("config: callout %+v, %d nkey users", opts.AuthCallout, len(opts.Nkeys))
	}
	first, _ := os.ReadFile(conf)
	// A second run keeps the seeds: the same config.
	if _, err := run(t, "bus-auth", "-out", dir); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(conf)
	if string(first) != string(second) {
		t.Fatal("a second run changed the credentials")
	}
	if _, err := run(t, "bus-auth"); err == nil || !strings.Contains(err.Error(), "-out") {
		t.Fatalf("no -out: %v", err)
	}
}
