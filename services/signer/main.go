// Command signer is meshagent's CA: it signs workload CSRs over NATS and over Istio's
// CA gRPC API, rotates its root and publishes the trust bundle.
package main

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/signer/signer"
)

func main() { lifecycle.Main("signer", run) }

// run is the whole process: Load → Connect → New → Run (pkg/lifecycle).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return lifecycle.Serve(ctx, args, getenv, signer.Load, signer.New)
}
