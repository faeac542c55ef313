// Package config reads the operator's configuration: flags, then env vars, then defaults.
package config

import (
	"os"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
)

// Config is the operator's whole configuration.
type Config struct {
	Log    obs.LogConfig
	Bus    bus.Config
	Listen struct {
		HTTP string // the dashboard, its API, /healthz, /readyz and /metrics
		// Hosts are the names the dashboard answers besides -http-addr's (and
		// localhost on loopback): against DNS rebinding, any other Host is refused.
		Hosts []string
	}
	Instance  string // this replica's name on the bus (default: hostname)
	Inventory struct {
		Replicas int // JetStream replicas of the inventory bucket, if this replica creates it
	}
	// History is how far back the page's event feed starts (replayed from the stream).
	History time.Duration
	// Memory is the container's memory limit (bytes; 0: none known), from which
	// the Go runtime's soft limit is set unless GOMEMLIMIT is (GoMemLimitSet), and
	// its GC percent unless GOGC is (GoGCSet).
	Memory struct {
		Limit         int
		GoMemLimitSet bool
		GoGCSet       bool
	}
	// Audit is the optional JSON-lines copy of every event seen live.
	Audit struct {
		File  string
		MaxMB int
		Keep  int
	}
}

// Default returns the defaults.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	c.Bus.URL = bus.DefaultURL
	c.Listen.HTTP = "127.0.0.1:9080"
	c.Instance, _ = os.Hostname()
	c.Inventory.Replicas = 1
	c.History = 30 * time.Minute
	c.Audit.MaxMB = 100
	c.Audit.Keep = 5
	return c
}

// Load reads flags and env vars over the defaults and validates the result.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Default()
	fs := c.bind(getenv)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.Bus.Name = "operator/" + c.Instance
	// The inventory's own role: its durable, its bucket, the events.
	c.Bus.AsService(policy.Inventory)
	return c, c.Validate()
}

func (c *Config) bind(getenv func(string) string) *flagenv.Set {
	fs := flagenv.New("operator", getenv)
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "listen address of the dashboard, its API, /healthz, /readyz and /metrics (fleet metrics included)")
	fs.List(&c.Listen.Hosts, "allowed-hosts", "HTTP_ALLOWED_HOSTS", nil, "host names the dashboard answers besides -http-addr's (and localhost when on loopback): a request for any other Host is refused, against DNS rebinding")
	fs.String(&c.Instance, "instance", "OPERATOR_INSTANCE", c.Instance, "this replica's name on the bus (default: hostname)")
	fs.Int(&c.Inventory.Replicas, "bucket-replicas", "INVENTORY_REPLICAS", c.Inventory.Replicas, "replicas of the inventory bucket if it is created (3 on a fleet's cluster)")
	fs.Duration(&c.History, "history", "OPERATOR_HISTORY", c.History, "how much history the page's event feed starts with")
	fs.String(&c.Audit.File, "audit-file", "AUDIT_FILE", c.Audit.File, "also write every event seen to this JSON-lines file (rotated by size)")
	fs.Int(&c.Audit.MaxMB, "audit-file-max-mb", "AUDIT_FILE_MAX_MB", c.Audit.MaxMB, "size in MiB at which -audit-file is rotated")
	fs.Int(&c.Audit.Keep, "audit-file-keep", "AUDIT_FILE_KEEP", c.Audit.Keep, "rotated -audit-file files kept")
	fs.Int(&c.Memory.Limit, "memory-limit", "MEMORY_LIMIT", 0, "the container's memory limit in bytes (Kubernetes: resourceFieldRef limits.memory): the Go runtime keeps the heap under 85% of it unless GOMEMLIMIT is set, and collects at 1.5x the live heap unless GOGC is")
	c.Memory.GoMemLimitSet = getenv("GOMEMLIMIT") != ""
	c.Memory.GoGCSet = getenv("GOGC") != ""
	return fs
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	p.Add(c.Log.Validate())
	p.Add(c.Bus.Validate())
	p.Check(c.Listen.HTTP != "", "-http-addr: required")
	p.Check(c.Instance != "", "-instance: required (no hostname to default to)")
	p.Check(len(c.Instance) <= 128, "-instance: at most 128 characters")
	p.Check(c.Inventory.Replicas >= 1 && c.Inventory.Replicas <= 5, "-bucket-replicas: must be 1 to 5")
	p.Check(c.History > 0, "-history: must be positive")
	p.Check(c.Audit.MaxMB >= 1, "-audit-file-max-mb: must be at least 1")
	p.Check(c.Audit.Keep >= 0, "-audit-file-keep: must not be negative")
	p.Check(c.Memory.Limit >= 0, "-memory-limit: must not be negative")
	return p.Err()
}

// Process is what the lifecycle reads: the logger, the HTTP address (which also
// serves the dashboard) and the bus.
func (c Config) Process() lifecycle.Process {
	return lifecycle.Process{Name: "operator", Log: c.Log, HTTP: c.Listen.HTTP, Bus: &c.Bus}
}
