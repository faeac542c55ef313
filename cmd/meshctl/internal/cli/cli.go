// Package cli is meshctl's command line: the operator's commands (the local stack,
// status, tokens, signing, rotation, events, SDS, bus credentials, and the bench
// commands, whose load generators are loadgen's), and the dispatch to them and to
// the development stack's compose plumbing (devstack/compose), which meshctl -h
// lists apart.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/compose"
	"github.com/meshagent/meshagent/pkg/buildinfo"
)

// Env is what every command gets from main.
type Env = command.Env

// operator are the operator's commands, in the order meshctl -h lists them.
var operator = []command.Command{
	{Name: "up", Usage: "start the local stack (embedded NATS, signer, rotator, demo pods) until Ctrl-C", Run: runUp},
	{Name: "status", Usage: "summarise the stack and the fleet; exits non-zero when something needs attention", Run: runStatus},
	{Name: "events", Usage: "replay and follow the audit log: events [-follow] [-since 1h|RFC3339] [-pod P] [-type T] [-o json]", Run: runEvents},
	{Name: "certs", Usage: "list the certificate inventory, soonest expiry first: certs [-o wide|json] [-bench]", Run: runCerts},
	{Name: "check", Usage: "pre-flight of a running bus and fleet: roles enforced, streams in quorum, signers, clocks, CA material, expiry horizons; exits non-zero with what to fix", Run: runCheck},
	{Name: "bug-report", Usage: "write a support bundle (tar.gz): versions, status, check, proxy-status, certs, recent events, logs where reachable: bug-report [-o FILE] [-since 1h]", Run: runBugReport},
	{Name: "describe", Usage: "one pod in one view: identity, certificate, roots, xDS streams, recent events: describe pod [NAMESPACE/]NAME", Run: runDescribe},
	{Name: "proxy-status", Usage: "each pod's ADS streams: upstream, last version ACKed or NACKed per type: proxy-status [-all] [NAMESPACE/NAME]", Run: runProxyStatus},
	{Name: "inspect", Usage: "show a certificate and whether it verifies: inspect <pod | serial | PEM file>", Run: runInspect},
	{Name: "sign", Usage: "get a certificate signed for a minted token: sign -ns NS -sa SA [-pod POD] [-out DIR] [-grpc]", Run: runSign},
	{Name: "csr", Usage: "one CreateCertificate over the Istio gRPC API, printing the chain: csr -ns NS -sa SA | -cert F -key F [-impersonate ID] [-signer NAME]; csr -bus -pod POD -cert F -key F renews by certificate over the bus", Run: runCSR},
	{Name: "bench", Usage: "load the signer for capacity planning: bench sign [-n N | -duration D] [-in-flight K] [-key-alg A]; bench storm -pods N [-conns 1|3]", Run: runBench},
	{Name: "sds", Usage: "fetch secrets from a pod over SDS: sds -pod ID [names...] or sds -socket PATH", Run: runSDS},
	{Name: "trust", Usage: "show the trust domains the fleet trusts, where each bundle came from and when it refreshes: trust [-o json]", Run: runTrust},
	{Name: "dns", Usage: "ask a pod's DNS proxy for a name: dns [-pod ID | -server ADDR] [-type A] [-tcp] NAME", Run: runDNS},
	{Name: "rotate", Usage: "rotate root [-new-key] [-wait D] | rotate pod [NAMESPACE/]NAME (a bare name: namespace default)", Run: runRotate},
	{Name: "token", Usage: "mint a dev service-account token: token -ns NS -sa SA [-ttl D]", Run: runToken},
	{Name: "bus-auth", Usage: "generate a fleet's bus credentials and nats-server auth config: bus-auth -out DIR", Run: runBusAuth},
	{Name: "version", Usage: "print meshctl's version (also -version); status shows each service's", Run: runVersion},
}

func runVersion(_ context.Context, env Env, _ []string) error {
	fmt.Fprintln(env.Stdout, buildinfo.String("meshctl"))
	return nil
}

// Run dispatches args[0] to its command.
func Run(ctx context.Context, env Env, args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(env.Stdout)
		return nil
	}
	if args[0] == "-version" || args[0] == "--version" {
		return runVersion(ctx, env, nil)
	}
	for _, group := range [][]command.Command{operator, compose.Commands} {
		for _, c := range group {
			if c.Name == args[0] {
				return c.Run(ctx, env, args[1:])
			}
		}
	}
	usage(env.Stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

func usage(w io.Writer) {
	var b strings.Builder
	b.WriteString("meshctl: run a local meshagent stack, and inspect and drive a mesh\n\ncommands:\n")
	list := func(cs []command.Command) {
		for _, c := range cs {
			fmt.Fprintf(&b, "  %-16s %s\n", c.Name, c.Usage)
		}
	}
	list(operator)
	b.WriteString("\ndevelopment stack (the containers of deploy/compose run these; not for operators):\n")
	list(compose.Commands)
	b.WriteString("\nThe commands that read the local stack take -dir (default .meshagent, env MESHAGENT_DIR); every command's -h shows its flags.\n")
	_, _ = io.WriteString(w, b.String())
}

var errUsage = errors.New("usage")
