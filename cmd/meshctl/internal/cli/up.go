package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/democp"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/nats-io/nats.go"
)

func dirFlag(fs *flagenv.Set, p *string) {
	fs.String(p, "dir", "MESHAGENT_DIR", ".meshagent", "state directory of the local stack")
}

func runUp(ctx context.Context, env Env, args []string) error {
	var cfg devstack.Config
	var logc obs.LogConfig
	fs := flagenv.New("up", env.Getenv)
	dirFlag(fs, &cfg.Dir)
	logc.Level = "warn" // the stand-in Envoy and the event lines say what happens
	logc.Bind(fs)
	fs.String(&cfg.BinDir, "bin-dir", "MESHAGENT_BIN", "", "directory of the service binaries (default: beside meshctl, then bin/, then PATH)")
	fs.String(&cfg.TrustDomain, "trust-domain", "TRUST_DOMAIN", "cluster.local", "SPIFFE trust domain")
	fs.Int(&cfg.Pods, "pods", "MESHAGENT_PODS", 1, "number of demo pods")
	fs.Int(&cfg.Nodes, "nodes", "MESHAGENT_NODES", 0, "node agents to run (the node tier: node-0, node-1, ...), each a leaf node of the embedded hub; the demo pods are spread over them round robin and reach the bus through their node. 0: every pod connects to the hub itself")
	fs.Bool(&cfg.OneProcessPods, "one-process-pods", "MESHAGENT_ONE_PROCESS_PODS", false, "run each demo pod's sds-edge, xds-relay and launcher in one process (meshagent pod) instead of three")
	fs.Duration(&cfg.LeafTTL, "ttl", "SECRET_TTL", 2*time.Minute, "workload certificate TTL of the demo pods (short, to watch rotation)")
	fs.Duration(&cfg.RootTTL, "root-ttl", "CITADEL_SELF_SIGNED_CA_CERT_TTL", 10*365*24*time.Hour, "self-signed root TTL")
	fs.Duration(&cfg.RootCheck, "root-check-interval", "CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL", time.Hour, "how often the signer checks the root's remaining life")
	fs.Int(&cfg.NATSPort, "nats-port", "MESHAGENT_NATS_PORT", -1, "embedded NATS port (-1: any free port)")
	fs.Duration(&cfg.ReadyWait, "ready-wait", "", time.Minute, "how long to wait for each service to be ready")
	fs.Duration(&cfg.EventsMaxAge, "events-max-age", "EVENTS_MAX_AGE", bus.DefaultEventStreamMaxAge, "how long the event history (the audit log) is kept; its size is bounded at 1 GiB")
	fs.String(&cfg.DashboardAddr, "dashboard-addr", "MESHAGENT_DASHBOARD_ADDR", "127.0.0.1:9080", "listen address of the dashboard, its API and the fleet metrics (the operator service)")
	fs.List(&cfg.DashboardHosts, "dashboard-allowed-hosts", "MESHAGENT_DASHBOARD_HOSTS", nil, "host names the dashboard answers besides -dashboard-addr's (and localhost on loopback); other Host headers are refused (DNS rebinding)")
	fs.String(&cfg.BundleEndpointAddr, "bundle-endpoint-addr", "BUNDLE_ENDPOINT_ADDR", "127.0.0.1:0", "where the signer serves this trust domain's SPIFFE bundle for other domains to follow (port 0: a free one; empty: not served)")
	fs.String(&cfg.Federate, "federate", "SPIFFE_BUNDLE_ENDPOINTS", "", "foreign trust domains to follow, as Istio: td|https://url||td2|https://url2 (another local stack's stack.json signer.bundle_endpoint)")
	fs.String(&cfg.FederateCA, "federate-ca", "SPIFFE_BUNDLE_CA_FILE", "", "PEM roots of the -federate endpoints (another local stack's signer.bundle_endpoint_ca); empty: system roots")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if err := logc.Validate(); err != nil {
		return err
	}
	log := obs.NewLogger("meshctl", logc, env.Stderr)
	// Events seen while the stack starts are held and printed after the summary.
	var mu sync.Mutex
	var early []string
	started := false
	onEvent := printer(func(line string) {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			early = append(early, line)
			return
		}
		fmt.Fprintln(env.Stdout, line)
	})
	cfg.OnEvent = onEvent
	r, err := devstack.New(cfg, env.Stdout, log)
	if err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, "meshctl: starting the local stack ...")
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(env.Stdout, "meshctl: stopping ...")
		r.Stop()
		fmt.Fprintln(env.Stdout, "meshctl: stopped")
	}()
	took := time.Since(start)
	printSummary(env.Stdout, &r.Stack, took, demoLookups(ctx, &r.Stack, democp.BackendShortName, 15*time.Second))
	mu.Lock()
	for _, line := range early {
		fmt.Fprintln(env.Stdout, line)
	}
	started = true
	mu.Unlock()
	go r.RefreshTokens(ctx)
	// A service that exits is restarted (with backoff) as a pod's restartPolicy
	// would; only Ctrl-C stops the stack.
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-r.Exited():
			fmt.Fprintf(env.Stderr, "meshctl: %s\n", msg)
		}
	}
}

// printSummary prints the stack; dns is each pod's DNS proxy's answer for the
// demo backend's short name.
func printSummary(w io.Writer, s *stackfile.Stack, took time.Duration, dns map[string]string) {
	fmt.Fprintf(w, "\nmeshagent is up (%s). State in %s\n\n", took.Round(time.Millisecond), s.Dir)
	fmt.Fprintf(w, "  NATS (embedded, JetStream)  %s, loopback only\n", s.NATSURL)
	fmt.Fprintf(w, "      authenticated           each service its own nkey, pods their service-account token (signer's auth callout)\n")
	fmt.Fprintf(w, "      credentials             %s (admin: %s)\n", filepath.Dir(s.NATSAdminNKey), filepath.Base(s.NATSAdminNKey))
	fmt.Fprintf(w, "      leaf listener           %s (node agents of %s; meshctl bench storm -nodes)\n", s.LeafURL, s.NodeAgentAccount)
	fmt.Fprintf(w, "      monitoring              %s/varz\n", s.NATSMonitor)
	for _, n := range s.Nodes {
		fmt.Fprintf(w, "  node %-22s pods connect to nats://%s, http %s\n", n.Name, n.Bus, n.HTTP)
	}
	fmt.Fprintf(w, "  signer                      NATS %s, gRPC %s (Istio CreateCertificate, TLS name %s), http %s\n",
		s.Signer.NATSSubject, s.Signer.GRPCAddr, s.Signer.GRPCServerName, s.Signer.HTTP)
	if len(s.Signer.CertSigners) > 0 {
		fmt.Fprintf(w, "      named signers           %s (CERT_SIGNERS; meshctl csr -signer)\n", strings.Join(s.Signer.CertSigners, ", "))
	}
	if len(s.Signer.TrustedNodeAccounts) > 0 {
		fmt.Fprintf(w, "      trusted node agents     %s, pod %s on node %s (CA_TRUSTED_NODE_ACCOUNTS; meshctl csr -impersonate)\n",
			strings.Join(s.Signer.TrustedNodeAccounts, ", "), devstack.NodeAgentPod, devstack.Node)
	}
	if s.Signer.BundleEndpoint != "" {
		fmt.Fprintf(w, "      bundle endpoint         %s (SPIFFE bundle of %s; its certificate: %s)\n", s.Signer.BundleEndpoint, s.TrustDomain, s.Signer.BundleEndpointCA)
	}
	if s.Signer.Federate != "" {
		fmt.Fprintf(w, "      federated with          %s (meshctl trust)\n", s.Signer.Federate)
	}
	fmt.Fprintf(w, "  rotator                     http %s\n", s.Rotator.HTTP)
	if s.ControlPlane != nil {
		fmt.Fprintf(w, "  demo control plane          xDS %s\n", s.ControlPlane.XDSAddr)
	}
	fmt.Fprintf(w, "  trust bundle                %s\n", s.TrustBundle)
	if s.Dashboard != "" {
		fmt.Fprintf(w, "  dashboard                   http://%s/  (fleet metrics: http://%s/metrics)\n", s.Dashboard, s.Dashboard)
	}
	for _, p := range s.Pods {
		fmt.Fprintf(w, "  pod %-23s %s\n", p.ID, p.SPIFFEID)
		if p.Node != "" {
			fmt.Fprintf(w, "      node                    %s (BUS_VIA_NODE)\n", p.Node)
		}
		fmt.Fprintf(w, "      SDS socket              %s\n", p.SDSSocket)
		fmt.Fprintf(w, "      xDS socket              %s\n", p.XDSSocket)
		fmt.Fprintf(w, "      certs (OUTPUT_CERTS)    %s\n", p.OutputCerts)
		fmt.Fprintf(w, "      envoy                   %s\n", p.Envoy)
		fmt.Fprintf(w, "      status port             http://%s/healthz/ready, /stats/prometheus (node %s)\n", p.Status, p.NodeID)
		if p.DNS != "" {
			fmt.Fprintf(w, "      DNS proxy               %s udp+tcp: %s\n", p.DNS, dns[p.ID])
		}
	}
	fmt.Fprintf(w, "\n  logs: %s/logs/   machine-readable: %s/%s\n", s.Dir, s.Dir, stackfile.FileName)
	fmt.Fprintf(w, "  try:  bin/meshctl status | bin/meshctl sign -ns default -sa web | bin/meshctl rotate pod demo-0\n")
	fmt.Fprintf(w, "        bin/meshctl certs | bin/meshctl events -since 10m -pod demo-0 | bin/meshctl inspect demo-0\n")
	fmt.Fprintf(w, "        bin/meshctl dns %s | bin/meshctl dns -type AAAA example.com\n", democp.BackendShortName)
	fmt.Fprintf(w, "\nEvents (Ctrl-C stops everything):\n")
}

// printer turns every event into one line for out, except meshctl bench's load
// (events.BenchNamespace: thousands of lines a second), said once.
func printer(out func(string)) nats.MsgHandler {
	var benchSaid atomic.Bool
	return func(m *nats.Msg) {
		e := auditlog.Decode(m, 0)
		if e.Err == nil && e.Bench() {
			if !benchSaid.Swap(true) {
				out(fmt.Sprintf("meshctl: events of namespace %s (meshctl bench) are not printed here; meshctl events shows them", events.BenchNamespace))
			}
			return
		}
		out(e.Line(time.Now()))
	}
}
