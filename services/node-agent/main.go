// Command node-agent is a Kubernetes node's tier of the meshagent bus: a NATS leaf
// node that admits the pods scheduled on its node by their own service-account
// tokens and holds one connection to the hub for all of them (docs/scale.md,
// "The node tier"). It runs once per node, as a DaemonSet.
package main

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/node-agent/nodeagent"
)

func main() { lifecycle.Main("node-agent", run) }

// run is the whole process: Load → New → Run (pkg/lifecycle).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return lifecycle.Serve(ctx, args, getenv, nodeagent.Load, nodeagent.New)
}
