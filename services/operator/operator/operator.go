// Package operator is the operator service, importable: it keeps the fleet's
// certificate inventory from the public events and serves the operator's view of
// the fleet — the dashboard page, its API and the fleet metrics — on the process's
// one HTTP listener, beside /healthz, /readyz and /metrics (package dashboard does
// the work). Replicas share the inventory. It is built and run the one way every
// meshagent service is (pkg/lifecycle): Load → New(cfg, Deps) → Run.
package operator

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/operator/internal/config"
	"github.com/meshagent/meshagent/services/operator/internal/dashboard"
)

// Config is the operator's whole configuration.
type Config = config.Config

// Load reads the configuration from flags and env vars over the defaults and
// validates it.
func Load(args []string, getenv func(string) string) (Config, error) {
	return config.Load(args, getenv)
}

// Operator is one replica of the operator service.
type Operator struct {
	dash *dashboard.Server
}

// New builds a replica on d.Bus (required), registers the fleet metrics on
// d.Metrics, its readiness (the inventory loaded) on d.Health and the page and its
// API at "/" on d.Routes. It touches neither the bus nor the audit file until Run.
func New(cfg Config, d lifecycle.Deps) (*Operator, error) {
	d = d.WithDefaults()
	if d.Bus == nil {
		return nil, errors.New("operator: no bus connection")
	}
	if limit := MemoryLimit(cfg); limit > 0 {
		debug.SetMemoryLimit(limit)
		d.Log.Info("heap kept under the container's memory limit", "limit_bytes", cfg.Memory.Limit, "go_memory_limit_bytes", limit)
	}
	if cfg.Memory.Limit > 0 && !cfg.Memory.GoGCSet {
		// The index is most of the heap and changes little: collecting at 1.5x the
		// live heap, not 2x, keeps 100,000 certificates at ~150 MiB RSS
		// (docs/benchmarks.md, issue 36).
		debug.SetGCPercent(50)
	}
	dc := dashboard.Config{Metrics: d.Metrics, Replicas: cfg.Inventory.Replicas, History: cfg.History,
		Listen: cfg.Listen.HTTP, Hosts: cfg.Listen.Hosts}
	if cfg.Audit.File != "" {
		s, err := auditlog.NewSink(cfg.Audit.File, int64(cfg.Audit.MaxMB)<<20, cfg.Audit.Keep)
		if err != nil {
			return nil, fmt.Errorf("-audit-file: %w", err)
		}
		dc.Sink = s
	}
	dash, err := dashboard.New(dc, d.Bus, d.Clock, d.Log.Named("dashboard"))
	if err != nil {
		return nil, err
	}
	d.Health.AddReadyCheck("inventory", dash.Ready)
	d.Routes.Handle("/", dash.Handler())
	d.Routes.Use(dash.Guard)
	return &Operator{dash: dash}, nil
}

// MemoryLimit is the Go runtime's soft memory limit for a container limited to
// cfg.Memory.Limit bytes: 85% of it, the rest for stacks, buffers and the
// runtime; 0 (leave it) when no limit is known or GOMEMLIMIT is set.
func MemoryLimit(cfg Config) int64 {
	if cfg.Memory.Limit <= 0 || cfg.Memory.GoMemLimitSet {
		return 0
	}
	return int64(cfg.Memory.Limit) / 100 * 85
}

// Run keeps the inventory and follows the events until ctx ends; it returns nil then.
func (o *Operator) Run(ctx context.Context) error {
	return lifecycle.Tasks(ctx, o.dash.Run)
}
