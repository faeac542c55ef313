// Command sds-edge is one pod's SDS server for Envoy: it owns the pod's private key,
// has it signed by the signer (or an Istio CA), and serves it over SDS v3 on a unix
// socket, renewing it on the rotator's word or at its own safety deadline.
package main

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/sds-edge/sdsedge"
)

func main() { lifecycle.Main("sds-edge", run) }

// run is the whole process: Load → Connect → New → Run (pkg/lifecycle).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return lifecycle.Serve(ctx, args, getenv, sdsedge.Load, sdsedge.New)
}
