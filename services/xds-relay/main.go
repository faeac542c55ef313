// Command xds-relay relays Envoy's ADS stream from a unix socket in the pod to the
// upstream discovery server, as Istio's agent does: Envoy never holds upstream
// credentials, and the relay presents the workload certificate from sds-edge.
package main

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/xds-relay/xdsrelay"
)

func main() { lifecycle.Main("xds-relay", run) }

// run is the whole process: Load → Connect → New → Run (pkg/lifecycle).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return lifecycle.Serve(ctx, args, getenv, xdsrelay.Load, xdsrelay.New)
}
