// Command launcher runs one pod's Envoy the way Istio's pilot-agent does: it starts
// Envoy once sds-edge holds the pod's certificates and xds-relay its upstream,
// serves the status port, and drains Envoy on shutdown; without Envoy it writes a
// gRPC xDS bootstrap for proxyless gRPC.
package main

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/launcher/launcher"
)

func main() { lifecycle.Main("launcher", run) }

// run is the whole process: Load → Connect → New → Run (pkg/lifecycle), or
// `launcher wait` (Istio's pilot-agent wait).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return launcher.Main(ctx, args, getenv)
}
