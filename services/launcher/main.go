// Command launcher writes one pod's Envoy bootstrap, starts Envoy when sds-edge and
// xds-relay are ready, and drains it on shutdown.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/services/launcher/internal/config"
	"github.com/meshagent/meshagent/services/launcher/internal/launch"
	"golang.org/x/sync/errgroup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		if flagenv.PrintHelp(err, os.Stdout) {
			return // -h: the flags, their env vars and defaults
		}
		fmt.Fprintln(os.Stderr, "launcher:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	log := obs.NewLogger("launcher", cfg.Log, os.Stderr)
	http := obs.NewServer(cfg.Listen.HTTP, log.Named("http"))
	l := launch.New(cfg, log.Named("launch"))
	http.AddReadyCheck("envoy", l.Ready)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return http.Run(ctx) })
	g.Go(func() error { return l.Run(ctx) })
	return g.Wait()
}
