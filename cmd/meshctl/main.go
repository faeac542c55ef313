// Command meshctl runs a local meshagent stack (meshctl up) and is the operator's
// tool to inspect and drive one: tokens, signing, rotation, events, status.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cli.Run(ctx, cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, os.Args[1:])
	if err != nil && !cli.IsHelp(err) {
		fmt.Fprintln(os.Stderr, "meshctl:", err)
		os.Exit(1)
	}
}
