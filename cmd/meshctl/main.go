// Command meshctl is the operator's tool for a meshagent mesh: it runs a local
// stack (meshctl up) and inspects and drives a stack or a fleet (status, events,
// sign, sds, rotate, token, bus-auth). Its image also runs the docker compose
// stack's plumbing (compose-secrets, kubelet, controlplane), listed apart in -h.
package main

import (
	"context"
	"os"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/cli"
	"github.com/meshagent/meshagent/pkg/lifecycle"
)

func main() { lifecycle.Main("meshctl", run) }

// run is the whole process: one command, until it ends or ctx is cancelled
// (lifecycle.Main turns -h into its flags and an error into exit code 1).
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return cli.Run(ctx, cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: getenv}, args)
}
