package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/loadgen"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
)

func runBench(ctx context.Context, env Env, args []string) error {
	switch {
	case len(args) > 0 && args[0] == "sign":
		return runBenchSign(ctx, env, args[1:])
	case len(args) > 0 && args[0] == "storm":
		return runBenchStorm(ctx, env, args[1:])
	case len(args) > 0 && args[0] == "storm-worker":
		// Not for people: a storm larger than one process runs its pods in
		// these (loadgen.RunWorker), its job on stdin.
		return loadgen.RunWorker(ctx, os.Stdin, env.Stdout)
	}
	return fmt.Errorf("%w: bench sign [flags] | bench storm [flags]", errUsage)
}

// runBenchSign is `meshctl bench sign`: loadgen.Sign with the flags' config.
func runBenchSign(ctx context.Context, env Env, args []string) error {
	var cfg loadgen.SignConfig
	var alg, output, encoding string
	var bf busFlags
	fs := flagenv.New("bench sign", env.Getenv)
	dirFlag(fs, &cfg.Dir)
	bf.bind(fs)
	fs.Int(&cfg.N, "n", "", 5000, "CSRs to prepare and send (with -duration: the keys cycled through, each time with a new CSR)")
	fs.Duration(&cfg.Duration, "duration", "", 0, "run this long instead of sending each prepared CSR once")
	fs.Int(&cfg.InFlight, "in-flight", "", 32, "requests in flight at once")
	fs.Duration(&cfg.RequestTimeout, "request-timeout", "", loadgen.DefaultRequestTimeout, "how long one request waits for its answer; one unanswered by then ends the run (give more on a loaded machine)")
	fs.Int(&cfg.Warmup, "warmup", "", 200, "requests sent, and not measured, before the run")
	fs.String(&alg, "key-alg", "", string(pki.ECP256), "key algorithm of the CSRs")
	fs.String(&cfg.Namespace, "ns", "", events.BenchNamespace, "namespace of the minted tokens; in "+events.BenchNamespace+" (the default) the certificates are kept out of fleet counts (status, certs, the dashboard) and out of meshctl up's event print")
	fs.String(&cfg.ServiceAccount, "sa", "", "load", "service account of the minted tokens (one per request: sa-0, sa-1, ...)")
	fs.String(&cfg.TokensFile, "tokens", "", "", "pre-minted tokens, one per line, used round robin (default: minted from the local stack's dev issuer)")
	fs.Int(&cfg.SignerPID, "signer-pid", "", 0, "pid of a local signer, whose CPU is read from /proc (default: the local stack's)")
	fs.String(&cfg.SignerMetrics, "signer-metrics", "", "", "the signer's /metrics URL, for its process_cpu_seconds_total when it is not local (default: the local stack's)")
	fs.String(&output, "o", "", "text", "output: text or json")
	fs.String(&cfg.Subject, "subject", "", loadgen.SubjectAny, "where requests go: any (sign.any, as the -nats-* user); pod or id: each in-flight requester connects as the pod its token is bound to (-tokens: pod-bound), admitted by the signer's auth callout, and signs on its sign.pod subject (token verified per request) or its sign.id subject (identity from the subject: signer run with -bus-sign-id)")
	fs.String(&encoding, "encoding", "", "compact", "how requests are encoded: compact (the sign subjects' one encoding; what sds-edge sends) or json (a CloudEvent: only to load a signer binary from before the compact encoding in an A/B run — a current signer refuses it)")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	var errs []error
	var err error
	if cfg.KeyAlg, err = pki.ParseKeyAlg(alg); err != nil {
		errs = append(errs, fmt.Errorf("-key-alg: %w", err))
	}
	if cfg.Encoding, err = events.ParseEncoding(encoding); err != nil {
		errs = append(errs, fmt.Errorf("-encoding: %w", err))
	}
	if err := errors.Join(append(errs, cfg.Validate(), checkOutput(output))...); err != nil {
		return err
	}
	// The local stack is read unless the flags name a bus and the tokens.
	if cfg.TokensFile == "" || bf.url == "" {
		if cfg.Stack, err = stackfile.Read(cfg.Dir); err != nil {
			return fmt.Errorf("%w (without a local stack, give -nats-url and -tokens)", err)
		}
	}
	if cfg.NATSURL, cfg.TLSCA = bf.url, bf.tlsCA; cfg.NATSURL == "" {
		cfg.NATSURL = cfg.Stack.NATSURL
	}
	cfg.Dial = func(ctx context.Context) (*nats.Conn, error) { return bf.connect(ctx, cfg.Stack, "meshctl bench sign") }
	res, err := loadgen.Sign(ctx, cfg)
	if err != nil {
		return err
	}
	return writeResult(env.Stdout, output, res)
}

// runBenchStorm is `meshctl bench storm`: loadgen.Storm with the flags' config,
// against the local stack (its dev issuer mints the pods' tokens).
func runBenchStorm(ctx context.Context, env Env, args []string) error {
	var cfg loadgen.StormConfig
	var dir, output string
	var bf busFlags
	fs := flagenv.New("bench storm", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	fs.Int(&cfg.Layout.Pods, "pods", "", 1000, "simulated pods, all starting at once, each with its own key, CSR and pod-bound token")
	fs.Int(&cfg.Layout.Nodes, "nodes", "", 0, "node agents (the node tier) to start against the stack's leaf listener and spread the pods over, each pod connecting to its node and signing on its node sign subject; 0: every pod connects to the hub itself")
	fs.Int(&cfg.Layout.ConnsPerPod, "conns", "", 1, "bus connections per pod: 1 as `meshagent pod` (what a fleet runs), 3 as the three-process pod (sds-edge, xds-relay, launcher)")
	fs.String(&cfg.BinDir, "bin-dir", "MESHAGENT_BIN", "", "directory of the node-agent binary (default: beside meshctl, then bin/, then PATH)")
	fs.Int(&cfg.PodsPerWorker, "pods-per-worker", "", 0, fmt.Sprintf("most connections one load process holds (the open-files limit); a larger storm runs in worker processes (meshctl itself), each taking whole nodes. 0: up to %d in meshctl's own process, else %d per worker", loadgen.MaxInProcess, loadgen.DefaultPodsPerWorker))
	fs.Int(&cfg.Nice, "nice", "", 10, "niceness of the storm's node agents and worker processes (0: meshctl's own): they stand for other machines, and must not starve the hub and the signer of this one's cores")
	fs.Int(&cfg.Procs, "sim-procs", "", 1, "GOMAXPROCS of the simulated machines: the node agents, the worker processes and meshctl's own pods (0: every core); each stands for a machine of its own, and runtimes that each think they own every core here spin for work on cores the others need")
	fs.String(&cfg.Namespace, "ns", "", "storm", "namespace of the pods")
	fs.String(&cfg.ServiceAccount, "sa", "", "load", "service account of the pods")
	fs.Duration(&cfg.Timeout, "timeout", "", 5*time.Minute, "give up on pods not certified by then")
	fs.Int(&cfg.SignerPID, "signer-pid", "", 0, "pid of a local signer (default: the local stack's)")
	fs.Int(&cfg.NATSPID, "nats-pid", "", 0, "pid of the local nats-server process (default: the one listening on the stack's NATS port)")
	fs.String(&output, "o", "", "text", "output: text or json")
	fs.String(&cfg.Rotate, "rotate", "", loadgen.RotateNone, "after the storm, rotate the root (same-key or new-key) and time the live pods' renewals until each holds a certificate of the new root")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if err := errors.Join(cfg.Validate(), checkOutput(output)); err != nil {
		return err
	}
	st, err := stackfile.Read(dir)
	if err != nil {
		return fmt.Errorf("%w (bench storm mints the pods' tokens with the local stack's dev issuer)", err)
	}
	bf.tlsCA = cmp.Or(bf.tlsCA, st.NATSTLSCA)
	cfg.Stack, cfg.NATSURL, cfg.TLSCA = st, cmp.Or(bf.url, st.NATSURL), bf.tlsCA
	cfg.IssuerDir = filepath.Join(dir, "issuer")
	cfg.Admin = func(ctx context.Context) (*nats.Conn, error) { return bf.connect(ctx, st, "meshctl bench storm") }
	res, err := loadgen.Storm(ctx, cfg)
	if err != nil {
		return err
	}
	if err := writeResult(env.Stdout, output, res); err != nil {
		return err
	}
	// Printed, and still a failure: a storm that could not read what it
	// measures (wasted=unknown) is no measurement.
	return res.Err()
}

// checkOutput checks -o of a command that prints text or json.
func checkOutput(output string) error {
	if output != "text" && output != "json" {
		return fmt.Errorf("-o: %q, want text or json", output)
	}
	return nil
}

// writeResult prints a load generator's result as -o asks: json, or text.
func writeResult(w io.Writer, output string, res interface{ WriteText(io.Writer) }) error {
	if output == "json" {
		return json.NewEncoder(w).Encode(res)
	}
	res.WriteText(w)
	return nil
}
