// Command rotator keeps the fleet's renewal schedule: it tells each pod when to
// renew its certificate, spreads storms under a fleet-wide rate limit, and renews
// every leaf under an old root after a root rotation.
package main

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/rotator/rotator"
)

func main() { lifecycle.Main("rotator", run) }

// run is the whole process: Load → Connect → New → Run (pkg/lifecycle).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return lifecycle.Serve(ctx, args, getenv, rotator.Load, rotator.New)
}
