// Package devstack runs the local development stack of meshctl up: an embedded
// NATS server with the bus secured, a signer, a rotator, the operator service
// (inventory and dashboard), the demo control plane
// (democp) and demo pods (sds-edge, xds-relay and launcher each, their tokens kept
// fresh by the kubelet stand-in), as child processes of its supervisor. What runs
// where is written to stack.json (stackfile). Its subpackages are the stack's parts,
// and those of the docker compose stack (compose, composesecrets, bustls).
package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubeapi"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubelet"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Config says what meshctl up starts.
type Config struct {
	Dir         string // state directory (.meshagent)
	BinDir      string // where the service binaries are; empty: beside meshctl, bin/, PATH
	TrustDomain string
	Pods        int
	// Nodes is how many node agents (the node tier) run, the demo pods spread
	// over them round robin; 0: every pod connects to the hub itself.
	Nodes     int
	LeafTTL   time.Duration // demo pods' SECRET_TTL: short, so rotation is visible
	RootTTL   time.Duration
	RootCheck time.Duration // how often the signer checks the root's remaining life
	// RootRotateMinInterval is the signer's -root-rotate-min-interval, the shortest
	// time between forced root rotations; 0 keeps the signer's default (1m).
	RootRotateMinInterval time.Duration
	NATSPort              int // -1: any free port
	// OneProcessPods runs each demo pod as one process (meshagent pod) instead of
	// three: for memory-tight nodes (docs/architecture.md).
	OneProcessPods bool
	ReadyWait      time.Duration
	// OnEvent, when set, receives every event from the moment the bus is up, so that
	// what happens during start-up (the pods' first certificates) is seen too.
	OnEvent nats.MsgHandler
	// DashboardAddr is where the operator service's page, API and metrics listen;
	// empty or port 0: a free port.
	DashboardAddr string
	// DashboardHosts are host names the dashboard answers besides its address's.
	DashboardHosts []string
	// EventsMaxAge is how long the event history (the audit log) is kept; 0: 7 days.
	EventsMaxAge time.Duration
	// BundleEndpointAddr, when set, is where the signer serves this trust domain's
	// SPIFFE bundle (https_web, a certificate from the bus CA); port 0: a free one.
	BundleEndpointAddr string
	// Federate lists foreign trust domains to follow, as Istio's
	// SPIFFE_BUNDLE_ENDPOINTS (td|https://url||td2|https://url2); FederateCA holds
	// the roots their endpoints' certificates chain to (empty: system roots).
	Federate, FederateCA string
}

// Runner is a started stack.
type Runner struct {
	cfg    Config
	out    io.Writer
	log    hclog.Logger
	ns     *server.Server
	nc     *nats.Conn
	sup    supervisor.Supervisor
	kube   kubelet.Kubelet     // the pods' tokens
	creds  *policy.Credentials // the bus credential set, under Dir/secrets
	stopCP func()
	// nodeAPI answers the signer's pod reads (caextras.go); stopNodeAPI stops it.
	nodeAPI     *kubeapi.Server
	stopNodeAPI func()
	// podsDir holds the pods' roots: under Dir, or under the temp dir when Dir is
	// too deep for the pods' unix socket paths.
	podsDir string
	// addrs are the ports startPods reserved for the pods, handed out by freeAddrs.
	addrs []string
	Stack stackfile.Stack
	// stackMu guards Stack.Processes and stack.json, rewritten on each restart.
	stackMu sync.Mutex
	// stopOnce: Start stops what it started when it fails, and its caller's
	// deferred Stop must then not stop the supervisor a second time.
	stopOnce sync.Once
}

// New checks cfg; nothing starts until Start.
func New(cfg Config, out io.Writer, log hclog.Logger) (*Runner, error) {
	var errs []error
	if cfg.Dir == "" {
		errs = append(errs, errors.New("-dir: required"))
	}
	if cfg.Pods < 0 || cfg.Pods > 50 {
		errs = append(errs, errors.New("-pods: want 0 to 50"))
	}
	if cfg.Nodes < 0 || cfg.Nodes > MaxNodes {
		errs = append(errs, fmt.Errorf("-nodes: want 0 to %d", MaxNodes))
	}
	if cfg.LeafTTL < 30*time.Second {
		errs = append(errs, errors.New("-ttl: at least 30s"))
	}
	if _, err := pki.WorkloadID(cfg.TrustDomain, "default", "x"); err != nil {
		errs = append(errs, fmt.Errorf("-trust-domain: %w", err))
	}
	if cfg.RootCheck <= 0 {
		cfg.RootCheck = time.Hour
	}
	if cfg.ReadyWait <= 0 {
		cfg.ReadyWait = time.Minute
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("-dir: %w", err)
	}
	cfg.Dir = abs
	r := &Runner{cfg: cfg, out: out, log: log}
	r.sup.Restart = true          // a crashed service comes back, as under a pod's restartPolicy
	r.sup.OnRestart = r.restarted // stack.json names the live pid (meshctl status)
	return r, nil
}

// Start brings the stack up and writes stack.json. On error, what started is stopped.
func (r *Runner) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			r.Stop()
		}
	}()
	iss, err := r.prepare()
	if err != nil {
		return err
	}
	busCA, err := r.startBus(ctx)
	if err != nil {
		return err
	}
	// The signer creates the event stream (-stream-max-age below): meshctl's admin
	// credential only reads it, since whoever may reconfigure it could make it
	// capture sign requests and their tokens.
	r.Stack = stackfile.Stack{
		Version: 1, Dir: r.cfg.Dir, TrustDomain: r.cfg.TrustDomain, NATSURL: r.natsURL(), NATSTLSCA: busCA,
		LeafURL: "nats://" + embedded.LeafAddr(r.ns), NATSMonitor: "http://" + embedded.MonitorAddr(r.ns), NodeAgentAccount: NodeTierAccount,
		NATSAdminNKey: r.creds.SeedFile(policy.Admin), NATSAuditNKey: r.creds.SeedFile(policy.Audit),
		TrustBundle: filepath.Join(r.cfg.Dir, "trust-bundle.pem"),
		TokenIssuer: stackfile.TokenIssuer{Issuer: iss.Name, Audience: devtoken.DefaultAudience, JWKS: devtoken.JWKSPath(filepath.Join(r.cfg.Dir, "issuer"))},
	}
	if err := protectSecrets(r.cfg.Dir, r.log); err != nil {
		return err
	}
	for _, start := range []func(context.Context) error{r.startSigner, r.startRotator, r.writeBundle, r.startOperator, r.startControlPlane, r.startNodes, r.startPods} {
		if err := start(ctx); err != nil {
			return err
		}
	}
	// After every pod is up, so that each process is listed with its pid.
	r.stackMu.Lock()
	defer r.stackMu.Unlock()
	for _, p := range r.sup.Processes() {
		r.Stack.Processes = append(r.Stack.Processes, stackfile.Process{Name: p.Name, PID: p.PID(), HTTP: p.HTTP, Log: p.LogPath})
	}
	return stackfile.Write(r.cfg.Dir, &r.Stack)
}

// prepare makes the state directories and the pods' directory, and loads (or
// makes, on the first start) the dev token issuer, which the kubelet stand-in
// mints the pods' tokens with, and the bus credentials.
func (r *Runner) prepare() (*devtoken.Issuer, error) {
	for _, d := range []string{r.cfg.Dir, filepath.Join(r.cfg.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	var err error
	if r.podsDir, err = podsDir(r.cfg.Dir, r.cfg.Pods); err != nil {
		return nil, err
	}
	iss, err := devtoken.LoadOrCreate(filepath.Join(r.cfg.Dir, "issuer"))
	if err != nil {
		return nil, err
	}
	r.kube = kubelet.Kubelet{Issuer: iss, TTL: time.Hour, Report: func(t kubelet.Token, err error) {
		if err != nil {
			r.log.Error("token refresh failed", "pod", t.Pod, "error", err)
		}
	}}
	// The bus is secured from the first start: every role has its own credential
	// (generated once, reused), pods are admitted by the signer's auth callout.
	if r.creds, err = policy.LoadOrGenerate(filepath.Join(r.cfg.Dir, "secrets")); err != nil {
		return nil, err
	}
	return iss, nil
}

// startBus starts the embedded NATS server with the bus secured and connects
// meshctl to it as the operator (admin); it returns the bus CA file.
func (r *Runner) startBus(ctx context.Context) (busCA string, err error) {
	serverTLS, busCA, err := busTLS(r.cfg.Dir)
	if err != nil {
		return "", err
	}
	// A loopback leaf listener for node agents (the node tier: -nodes, bench
	// storm -nodes), and nats-server's monitoring (/varz: the hub's
	// connections), both on loopback.
	r.ns, err = embedded.Start(embedded.Config{Port: r.cfg.NATSPort, StoreDir: filepath.Join(r.cfg.Dir, "nats"), Auth: &r.creds.Keys,
		TLS: serverTLS, AllowNonTLS: true, LeafPort: -1, MonitorPort: -1})
	if err != nil {
		return "", err
	}
	r.nc, err = bus.Connect(ctx, bus.Config{URL: r.natsURL(), Name: "meshctl", NKeyFile: r.creds.SeedFile(policy.Admin),
		InboxPrefix: policy.Inbox(policy.Admin, events.PodRef{}), ConnectWait: 5 * time.Second}, r.log.Named("bus"))
	if err != nil {
		return "", fmt.Errorf("connect embedded nats: %w", err)
	}
	if r.cfg.OnEvent != nil {
		if _, err := r.nc.Subscribe(events.EventsWildcard, r.cfg.OnEvent); err != nil {
			return "", fmt.Errorf("subscribe events: %w", err)
		}
	}
	return busCA, nil
}

// restarted records a restarted child's new pid in stack.json, so that meshctl
// status shows the process that runs, not the one that died.
func (r *Runner) restarted(p *supervisor.Process) {
	r.stackMu.Lock()
	defer r.stackMu.Unlock()
	for i := range r.Stack.Processes {
		if r.Stack.Processes[i].Name == p.Name {
			r.Stack.Processes[i].PID = p.PID()
		}
	}
	if err := stackfile.Write(r.cfg.Dir, &r.Stack); err != nil {
		r.log.Warn("stack file not updated after a restart", "process", p.Name, "error", err)
	}
}

// RefreshTokens re-mints every pod's token every half hour until ctx ends, as the
// kubelet refreshes a projected token.
func (r *Runner) RefreshTokens(ctx context.Context) {
	r.kube.Run(ctx, 30*time.Minute)
}

// Conn is meshctl's own bus connection.
func (r *Runner) Conn() *nats.Conn { return r.nc }

// Stop stops the children in reverse order, then the bus; once, however often
// it is called.
func (r *Runner) Stop() { r.stopOnce.Do(r.stop) }

func (r *Runner) stop() {
	r.sup.Stop(10 * time.Second)
	if r.stopCP != nil {
		r.stopCP()
	}
	if r.stopNodeAPI != nil {
		r.stopNodeAPI()
	}
	if r.nc != nil {
		_ = r.nc.Drain()
	}
	if r.ns != nil {
		r.ns.Shutdown()
		r.ns.WaitForShutdown()
	}
	_ = os.Remove(filepath.Join(r.cfg.Dir, stackfile.FileName))
	if r.podsDir != "" && filepath.Dir(r.podsDir) != r.cfg.Dir {
		_ = os.RemoveAll(r.podsDir)
	}
}

// Exited yields a message for each exit of a child process, which the
// supervisor restarts with backoff.
func (r *Runner) Exited() <-chan string { return r.sup.Exited() }
