package config

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

func TestLoadFlagsOverEnvOverDefaults(t *testing.T) {
	env := testkit.Env(map[string]string{"HTTP_ADDR": "0.0.0.0:9080", "INVENTORY_REPLICAS": "3", "AUDIT_FILE": "/var/log/a.jsonl",
		"OPERATOR_INSTANCE": "op-env", "NATS_URL": "nats://nats:4222"})
	c, err := Load([]string{"-bucket-replicas", "2", "-history", "5m"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen.HTTP != "0.0.0.0:9080" || c.Inventory.Replicas != 2 || c.History != 5*time.Minute ||
		c.Audit.File != "/var/log/a.jsonl" || c.Audit.MaxMB != 100 || c.Audit.Keep != 5 || c.Bus.Name != "operator/op-env" {
		t.Fatalf("config: %+v", c)
	}
	if c.Bus.InboxPrefix == "" {
		t.Fatal("no inbox prefix of the inventory role")
	}
}

func TestValidateNamesEveryBadFlag(t *testing.T) {
	_, err := Load([]string{"-http-addr", "", "-instance", "x", "-bucket-replicas", "0", "-history", "-1s",
		"-audit-file-max-mb", "0", "-audit-file-keep", "-1"}, testkit.Env(nil))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, flag := range []string{"-http-addr", "-bucket-replicas", "-history", "-audit-file-max-mb", "-audit-file-keep"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("error does not name %s: %v", flag, err)
		}
	}
}

// TestMemoryLimitFromTheContainer: the container's limit (the downward API's
// limits.memory) is read from MEMORY_LIMIT; a GOMEMLIMIT of the operator's own is
// noted, so that the runtime's is left alone.
func TestMemoryLimitFromTheContainer(t *testing.T) {
	env := map[string]string{"MEMORY_LIMIT": "268435456", "NATS_NKEY": "/x.nk"}
	c, err := Load(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Memory.Limit != 256<<20 || c.Memory.GoMemLimitSet {
		t.Fatalf("memory %+v", c.Memory)
	}
	env["GOMEMLIMIT"] = "100MiB"
	if c, _ := Load(nil, func(k string) string { return env[k] }); !c.Memory.GoMemLimitSet {
		t.Fatal("GOMEMLIMIT not noted")
	}
}
