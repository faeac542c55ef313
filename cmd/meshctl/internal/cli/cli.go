// Package cli implements meshctl's commands.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Env is what every command gets from main.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

type command struct {
	usage string
	run   func(ctx context.Context, env Env, args []string) error
}

var commands = map[string]command{
	"up":              {"start the local stack (embedded NATS, signer, rotator, demo pods) until Ctrl-C", runUp},
	"token":           {"mint a dev service-account token: token -ns NS -sa SA [-ttl D]", runToken},
	"sign":            {"get a certificate signed for a minted token: sign -ns NS -sa SA [-out DIR] [-grpc]", runSign},
	"rotate":          {"rotate root [-new-key] | rotate pod ID", runRotate},
	"events":          {"print every event on the bus as it happens", runEvents},
	"kubelet":         {"keep a pod's service-account token fresh (docker compose): kubelet -issuer-dir D -token-file F", runKubelet},
	"controlplane":    {"run the demo xDS control plane on its own: controlplane -addr HOST:PORT", runControlPlane},
	"bus-auth":        {"generate a fleet's bus credentials and nats-server auth config: bus-auth -out DIR", runBusAuth},
	"compose-secrets": {"make the compose stack's credentials, one directory per holder: compose-secrets -state DIR -out DIR", runComposeSecrets},
	"status":          {"show each service's readiness and each pod's certificates", runStatus},
	"sds":             {"fetch secrets from a pod over SDS: sds -pod ID [names...] or sds -socket PATH", runSDS},
}

// Run dispatches args[0] to its command.
func Run(ctx context.Context, env Env, args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(env.Stdout)
		return nil
	}
	c, ok := commands[args[0]]
	if !ok {
		usage(env.Stderr)
		return fmt.Errorf("unknown command %q", args[0])
	}
	return c.run(ctx, env, args[1:])
}

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("meshctl: run and inspect a local meshagent stack\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-15s %s\n", n, commands[n].usage)
	}
	b.WriteString("\nEvery command takes -dir (default .meshagent, env MESHAGENT_DIR); -h shows its flags.\n")
	_, _ = io.WriteString(w, b.String())
}

var errUsage = errors.New("usage")
