// Command signer is meshagent's CA: it signs workload CSRs over NATS and over Istio's
// CA gRPC API, rotates its root and publishes the trust bundle.
package main

import (
	"context"
	"runtime/debug"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/signer/signer"
)

func main() { lifecycle.Main("signer", run) }

// run is the whole process: Load → Connect → New → Run (pkg/lifecycle).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return lifecycle.Serve(ctx, args, getenv, load, signer.New)
}

// load is signer.Load that also sets the process's GC target (-gogc): the
// process is the signer's alone.
func load(args []string, getenv func(string) string) (signer.Config, error) {
	c, err := signer.Load(args, getenv)
	if err == nil {
		debug.SetGCPercent(c.GCPercent)
	}
	return c, err
}
