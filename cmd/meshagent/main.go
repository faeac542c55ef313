// Command meshagent is a pod's three roles in one executable, so that the pod's
// processes share its code pages:
//
//	meshagent sds-edge  <sds-edge flags>
//	meshagent xds-relay <xds-relay flags>
//	meshagent launcher  <launcher flags>
//	meshagent pod --sds-edge <flags> --xds-relay <flags> --launcher <flags>
//	meshagent proxy sidecar|router <pilot-agent flags>
//	meshagent wait [--timeoutSeconds 60] [--periodMillis 500] [--url http://localhost:15020/healthz/ready]
//
// `wait` (also `meshagent launcher wait`) is Istio's `pilot-agent wait`: it
// exits 0 once the pod's proxy is ready, 1 when the timeout passes first.
//
// `proxy` is Istio's `pilot-agent proxy`, so that the istio-proxy container of
// Istio's injection template runs meshagent unchanged: the pod mode, the
// launcher taking pilot-agent's arguments, the other roles only the env.
//
// Each role is its service package's lifecycle (Load → Connect → New → Run), with
// the same flags and environment as the per-service binary. `pod` hosts all three
// in one process, for memory-tight nodes: each role keeps its own Config, logger
// and /healthz, /readyz and /metrics server, the roles share one bus connection
// (lifecycle.SharedBus: one admission by the auth callout instead of three), and
// the first to fail stops the others (lifecycle.Tasks).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/launcher/launcher"
	"github.com/meshagent/meshagent/services/sds-edge/sdsedge"
	"github.com/meshagent/meshagent/services/xds-relay/xdsrelay"
)

// runFunc runs a role; shared is the process's shared bus connections (nil: the
// role connects on its own).
type runFunc func(ctx context.Context, shared *lifecycle.SharedBus, args []string, getenv func(string) string) error

// roles are the pod's roles by the name the per-service binary has.
var roles = map[string]runFunc{
	"sds-edge": func(ctx context.Context, shared *lifecycle.SharedBus, args []string, getenv func(string) string) error {
		return lifecycle.ServeShared(ctx, shared, args, getenv, sdsedge.Load, sdsedge.New)
	},
	"xds-relay": func(ctx context.Context, shared *lifecycle.SharedBus, args []string, getenv func(string) string) error {
		return lifecycle.ServeShared(ctx, shared, args, getenv, xdsrelay.Load, xdsrelay.New)
	},
	"launcher": func(ctx context.Context, shared *lifecycle.SharedBus, args []string, getenv func(string) string) error {
		if len(args) > 0 && args[0] == "wait" { // `launcher wait`, as Istio's pilot-agent wait
			return launcher.Main(ctx, args, getenv)
		}
		return lifecycle.ServeShared(ctx, shared, args, getenv, launcher.Load, launcher.New)
	},
	// wait is Istio's `pilot-agent wait`: block until the pod's proxy is ready.
	"wait": func(ctx context.Context, _ *lifecycle.SharedBus, args []string, getenv func(string) string) error {
		return launcher.Main(ctx, append([]string{"wait"}, args...), getenv)
	},
}

// podOrder is the order pod mode starts and names its roles in.
var podOrder = []string{"sds-edge", "xds-relay", "launcher"}

const usage = `usage: meshagent <role> [flags]
roles:
  sds-edge, xds-relay, launcher   one role, with that service's flags (meshagent <role> -h)
  pod --sds-edge <flags> --xds-relay <flags> --launcher <flags>
                                  all three roles in this one process
  proxy sidecar|router [pilot-agent flags]
                                  all three roles, as Istio's pilot-agent proxy (docs/istio.md)
  wait [--timeoutSeconds 60] [--periodMillis 500] [--url http://localhost:15020/healthz/ready]
                                  exit 0 once the pod's proxy is ready, 1 if not in time (Istio's pilot-agent wait)`

func main() {
	name := "meshagent"
	if len(os.Args) > 1 && (roles[os.Args[1]] != nil || os.Args[1] == "pod") {
		name = "meshagent " + os.Args[1]
	}
	lifecycle.Main(name, run)
}

// run dispatches args[0], the role, with the rest of args.
func run(ctx context.Context, args []string, getenv func(string) string) error {
	if len(args) == 0 {
		return errors.New("no role given\n" + usage)
	}
	if slices.Contains([]string{"-h", "-help", "--help", "help"}, args[0]) {
		return &flagenv.HelpError{Usage: usage + "\n  version                         print the version (also -version)\n"} // printed on stdout, exit 0
	}
	if args[0] == "pod" {
		return runPod(ctx, args[1:], getenv)
	}
	if args[0] == "proxy" {
		if len(args) < 2 || (args[1] != "sidecar" && args[1] != "router") {
			return fmt.Errorf("proxy: want `meshagent proxy sidecar` or `meshagent proxy router`, got %q\n%s", strings.Join(args[:min(len(args), 2)], " "), usage)
		}
		// Istio's `pilot-agent proxy <type> <flags>`, as its injection template runs
		// the istio-proxy container: the whole pod in this process, sds-edge and
		// xds-relay configured by the env alone, the launcher by the env and these args.
		return runPod(ctx, append([]string{"--sds-edge", "--xds-relay", "--launcher"}, args...), getenv)
	}
	r, ok := roles[args[0]]
	if !ok {
		return fmt.Errorf("unknown role %q\n%s", args[0], usage)
	}
	return r(ctx, nil, args[1:], getenv)
}

// splitPod splits pod mode's arguments at the --<role> markers. Every role must be
// given exactly once (possibly with no flags), so that a typo does not silently
// leave a role out.
func splitPod(args []string) (map[string][]string, error) {
	got := map[string][]string{}
	role := ""
	for _, a := range args {
		if r, ok := strings.CutPrefix(a, "--"); ok && slices.Contains(podOrder, r) {
			if _, dup := got[r]; dup {
				return nil, fmt.Errorf("pod: --%s given twice", r)
			}
			role, got[r] = r, []string{}
			continue
		}
		if role == "" {
			return nil, fmt.Errorf("pod: %q before the first role marker (--sds-edge, --xds-relay, --launcher)", a)
		}
		got[role] = append(got[role], a)
	}
	var missing []string
	for _, r := range podOrder {
		if _, ok := got[r]; !ok {
			missing = append(missing, "--"+r)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("pod: missing %s\n%s", strings.Join(missing, ", "), usage)
	}
	return got, nil
}

// runPod runs the three roles in this process until ctx ends or one fails. A
// role's error is prefixed with its name.
func runPod(ctx context.Context, args []string, getenv func(string) string) error {
	split, err := splitPod(args)
	if err != nil {
		return err
	}
	tasks := make([]func(context.Context) error, 0, len(podOrder))
	shared := &lifecycle.SharedBus{}
	for _, name := range podOrder {
		r, a := roles[name], split[name]
		tasks = append(tasks, func(ctx context.Context) error {
			if err := r(ctx, shared, a, getenv); err != nil {
				var exit *lifecycle.ExitError
				if errors.As(err, &exit) {
					return err // the launcher's Envoy exit code stays the process's
				}
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
	return lifecycle.Tasks(ctx, tasks...)
}
