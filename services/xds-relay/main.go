// Command xds-relay relays Envoy's ADS stream from a unix socket in the pod to the
// upstream discovery server, as Istio's agent does: Envoy never holds upstream
// credentials, and the relay presents the workload certificate from sds-edge.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/services/xds-relay/internal/config"
	"github.com/meshagent/meshagent/services/xds-relay/internal/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Environ()); err != nil {
		if flagenv.PrintHelp(err, os.Stdout) {
			return // -h: the flags, their env vars and defaults
		}
		fmt.Fprintln(os.Stderr, "xds-relay:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, environ []string) error {
	cfg, err := config.Load(args, getenv, environ)
	if err != nil {
		return err
	}
	return service.Run(ctx, cfg, obs.NewLogger("xds-relay", cfg.Log, os.Stderr))
}
