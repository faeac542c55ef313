// Command rotator keeps the fleet's renewal schedule: it tells each pod when to
// renew its certificate, spreads storms under a fleet-wide rate limit, and renews
// every leaf under an old root after a root rotation.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/services/rotator/internal/config"
	"github.com/meshagent/meshagent/services/rotator/internal/rotator"
	"golang.org/x/sync/errgroup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		if flagenv.PrintHelp(err, os.Stdout) {
			return // -h: the flags, their env vars and defaults
		}
		fmt.Fprintln(os.Stderr, "rotator:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	log := obs.NewLogger("rotator", cfg.Log, os.Stderr)
	nc, err := bus.Connect(ctx, cfg.Bus, log.Named("bus"))
	if err != nil {
		return err
	}
	defer func() { _ = nc.Drain() }()
	http := obs.NewServer(cfg.Listen.HTTP, log.Named("http"))
	r, err := rotator.New(rotator.FromConfig(cfg), nc, clock.Real{}, http.Registry(), log)
	if err != nil {
		return err
	}
	http.AddReadyCheck("rotator", r.Ready)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return http.Run(ctx) })
	g.Go(func() error { return r.Run(ctx) })
	return g.Wait()
}
