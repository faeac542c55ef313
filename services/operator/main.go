// Command operator keeps the fleet's certificate inventory from the public events
// and serves the operator's view of it: the dashboard, its API and fleet metrics.
// meshctl's certs, status, inspect and rotate read the inventory it keeps.
package main

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/operator/operator"
)

func main() { lifecycle.Main("operator", run) }

// run is the whole process: Load → Connect → New → Run (pkg/lifecycle).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return lifecycle.Serve(ctx, args, getenv, operator.Load, operator.New)
}
