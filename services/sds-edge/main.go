// Command sds-edge is one pod's SDS server for Envoy: it owns the pod's private key,
// has it signed by the signer (or an Istio CA), and serves it over SDS v3 on a unix
// socket, renewing it on the rotator's word or at its own safety deadline.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/services/sds-edge/internal/config"
	"github.com/meshagent/meshagent/services/sds-edge/internal/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		if flagenv.PrintHelp(err, os.Stdout) {
			return // -h: the flags, their env vars and defaults
		}
		fmt.Fprintln(os.Stderr, "sds-edge:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	log := obs.NewLogger("sds-edge", cfg.Log, os.Stderr).With("pod", cfg.Pod.ID)
	nc, err := bus.Connect(ctx, cfg.Bus, log.Named("nats"))
	if err != nil {
		return err
	}
	defer nc.Drain()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	http := obs.NewServer(cfg.Listen.HTTP, log.Named("http"))
	e, err := edge.New(cfg, edge.Deps{NC: nc, JS: js, Clock: clock.Real{}, Log: log,
		Registry: http.Registry()})
	if err != nil {
		return err
	}
	http.AddReadyCheck("secrets", e.Ready)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return http.Run(ctx) })
	g.Go(func() error { return e.Run(ctx) })
	return g.Wait()
}
