// Command signer is meshagent's CA: it signs workload CSRs over NATS and over Istio's
// CA gRPC API, rotates its root and publishes the trust bundle.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		if flagenv.PrintHelp(err, os.Stdout) {
			return // -h: the flags, their env vars and defaults
		}
		fmt.Fprintln(os.Stderr, "signer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	log := obs.NewLogger("signer", cfg.Log, os.Stderr)
	nc, err := bus.Connect(ctx, cfg.Bus, log.Named("bus"))
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while waiting for NATS
		}
		return err
	}
	defer func() { _ = nc.Drain() }()
	s, err := service.New(cfg, nc, log, time.Now)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
