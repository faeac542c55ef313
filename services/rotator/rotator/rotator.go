// Package rotator is the rotator service, importable: it keeps the fleet's
// renewal schedule and tells each pod when to renew its certificate (package
// renewal does the work). It is built and run the one way every meshagent
// service is (pkg/lifecycle): Load → New(cfg, Deps) → Run.
package rotator

import (
	"context"
	"errors"
	"fmt"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/rotator/internal/config"
	"github.com/meshagent/meshagent/services/rotator/internal/renewal"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is the rotator's whole configuration.
type Config = config.Config

// Load reads the configuration from flags and env vars over the defaults and
// validates it.
func Load(args []string, getenv func(string) string) (Config, error) {
	return config.Load(args, getenv)
}

// Rotator is one replica of the rotator service.
type Rotator struct {
	*renewal.Replica
	quorum *bus.QuorumWatch // the replication of the streams and buckets it reads and writes
}

// New builds a replica on d.Bus (required) and registers its metrics on
// d.Metrics and its readiness check on d.Health. It touches neither the bus nor
// the clock until Run.
func New(cfg Config, d lifecycle.Deps) (*Rotator, error) {
	d = d.WithDefaults()
	r, err := renewal.New(renewal.FromConfig(cfg), d)
	if err != nil {
		return nil, err
	}
	d.Health.AddReadyCheck("rotator", r.Ready)
	if d.Bus == nil {
		return nil, errors.New("rotator: no bus connection")
	}
	js, err := jetstream.New(d.Bus)
	if err != nil {
		return nil, fmt.Errorf("rotator: jetstream: %w", err)
	}
	q, err := bus.NewQuorumWatch(js, []string{events.StreamEvents, events.StreamPodEvents, "KV_" + cfg.Store.Bucket, "KV_" + cfg.HA.LeaseBucket},
		"rotator", d.Metrics, d.Clock, d.Log.Named("quorum"))
	if err != nil {
		return nil, err
	}
	return &Rotator{Replica: r, quorum: q}, nil
}

// Run takes part in the leader election and, while leading, sends renewals, until
// ctx ends; it returns nil then.
func (r *Rotator) Run(ctx context.Context) error {
	return lifecycle.Tasks(ctx, r.Replica.Run, r.quorum.Run)
}
