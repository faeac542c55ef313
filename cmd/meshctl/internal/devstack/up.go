// Package devstack runs the local development stack of meshctl up: an embedded
// NATS server with the bus secured, a signer, a rotator, the operator service
// (inventory and dashboard), the demo control plane
// (democp) and demo pods (sds-edge, xds-relay and launcher each, their tokens kept
// fresh by the kubelet stand-in), as child processes of its supervisor. What runs
// where is written to stack.json (stackfile). Its subpackages are the stack's parts,
// and those of the docker compose stack (compose, composesecrets, bustls).
package devstack

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/democp"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubeapi"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubelet"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Config says what meshctl up starts.
type Config struct {
	Dir         string // state directory (.meshagent)
	BinDir      string // where the service binaries are; empty: beside meshctl, bin/, PATH
	TrustDomain string
	Pods        int
	LeafTTL     time.Duration // demo pods' SECRET_TTL: short, so rotation is visible
	RootTTL     time.Duration
	RootCheck   time.Duration // how often the signer checks the root's remaining life
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
	for _, d := range []string{r.cfg.Dir, filepath.Join(r.cfg.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
	}
	if r.podsDir, err = podsDir(r.cfg.Dir, r.cfg.Pods); err != nil {
		return err
	}
	iss, err := devtoken.LoadOrCreate(filepath.Join(r.cfg.Dir, "issuer"))
	if err != nil {
		return err
	}
	r.kube = kubelet.Kubelet{Issuer: iss, TTL: time.Hour, Report: func(t kubelet.Token, err error) {
		if err != nil {
			r.log.Error("token refresh failed", "pod", t.Pod, "error", err)
		}
	}}
	// The bus is secured from the first start: every role has its own credential
	// (generated once, reused), pods are admitted by the signer's auth callout.
	r.creds, err = policy.LoadOrGenerate(filepath.Join(r.cfg.Dir, "secrets"))
	if err != nil {
		return err
	}
	serverTLS, busCA, err := busTLS(r.cfg.Dir)
	if err != nil {
		return err
	}
	r.ns, err = embedded.Start(embedded.Config{Port: r.cfg.NATSPort, StoreDir: filepath.Join(r.cfg.Dir, "nats"), Auth: &r.creds.Keys,
		TLS: serverTLS, AllowNonTLS: true})
	if err != nil {
		return err
	}
	r.nc, err = bus.Connect(ctx, bus.Config{URL: r.natsURL(), Name: "meshctl", NKeyFile: r.creds.SeedFile(policy.Admin),
		InboxPrefix: policy.Inbox(policy.Admin, events.PodRef{}), ConnectWait: 5 * time.Second}, r.log.Named("bus"))
	if err != nil {
		return fmt.Errorf("connect embedded nats: %w", err)
	}
	if r.cfg.OnEvent != nil {
		if _, err := r.nc.Subscribe(events.EventsWildcard, r.cfg.OnEvent); err != nil {
			return fmt.Errorf("subscribe events: %w", err)
		}
	}
	// The signer creates the event stream (-stream-max-age below): meshctl's admin
	// credential only reads it, since whoever may reconfigure it could make it
	// capture sign requests and their tokens.
	r.Stack = stackfile.Stack{
		Version: 1, Dir: r.cfg.Dir, TrustDomain: r.cfg.TrustDomain, NATSURL: r.natsURL(), NATSTLSCA: busCA,
		NATSAdminNKey: r.creds.SeedFile(policy.Admin), NATSAuditNKey: r.creds.SeedFile(policy.Audit),
		TrustBundle: filepath.Join(r.cfg.Dir, "trust-bundle.pem"),
		TokenIssuer: stackfile.TokenIssuer{Issuer: iss.Name, Audience: devtoken.DefaultAudience, JWKS: devtoken.JWKSPath(filepath.Join(r.cfg.Dir, "issuer"))},
	}
	if err := protectSecrets(r.cfg.Dir, r.log); err != nil {
		return err
	}
	if err := r.startSigner(ctx); err != nil {
		return err
	}
	if err := r.startRotator(ctx); err != nil {
		return err
	}
	if err := r.writeBundle(ctx); err != nil {
		return err
	}
	if err := r.startOperator(ctx); err != nil {
		return err
	}
	if err := r.startControlPlane(ctx); err != nil {
		return err
	}
	if err := r.startPods(ctx); err != nil {
		return err
	}
	// After every pod is up, so that each process is listed with its pid.
	r.stackMu.Lock()
	defer r.stackMu.Unlock()
	for _, p := range r.sup.Processes() {
		r.Stack.Processes = append(r.Stack.Processes, stackfile.Process{Name: p.Name, PID: p.PID(), HTTP: p.HTTP, Log: p.LogPath})
	}
	return stackfile.Write(r.cfg.Dir, &r.Stack)
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

// maxSocketPath is the longest unix socket path Linux accepts (sun_path less its NUL).
const maxSocketPath = 107

// longestSocket is the deepest socket a pod root holds (sds-edge's).
const longestSocket = "var/run/secrets/workload-spiffe-uds/socket"

// podsDir returns dir/pods, or a fresh directory under the system temp dir when the
// sockets under dir/pods would be longer than a unix socket path may be — a checkout
// deep in a home directory must still run.
func podsDir(dir string, pods int) (string, error) {
	want := filepath.Join(dir, "pods")
	last := filepath.Join(want, fmt.Sprintf("demo-%d", max(pods-1, 0)), longestSocket)
	if len(last) <= maxSocketPath {
		return want, os.MkdirAll(want, 0o755)
	}
	short, err := os.MkdirTemp("", "meshagent-pods-")
	if err != nil {
		return "", fmt.Errorf("pods dir: %w", err)
	}
	if len(filepath.Join(short, "demo-00", longestSocket)) > maxSocketPath {
		return "", fmt.Errorf("pods dir: %s is too deep for unix sockets too; set TMPDIR or -dir to a shorter path", short)
	}
	return short, nil
}

// spawn starts a service binary under the supervisor and waits for its /readyz.
func (r *Runner) spawn(ctx context.Context, name, bin string, args ...string) (*supervisor.Process, error) {
	httpAddr, err := supervisor.FreeAddr()
	if err != nil {
		return nil, err
	}
	return r.spawnAt(ctx, name, bin, httpAddr, args...)
}

// spawnAt is spawn with the service's HTTP address chosen by the caller.
func (r *Runner) spawnAt(ctx context.Context, name, bin, httpAddr string, args ...string) (*supervisor.Process, error) {
	path, lead, err := r.executable(bin)
	if err != nil {
		return nil, err
	}
	args = append([]string{"-nats-url", r.natsURL()}, args...)
	p := &supervisor.Process{Name: name, Bin: path, HTTP: httpAddr, Args: slices.Concat(lead, []string{"-http-addr", httpAddr}, args)}
	if err := r.start(ctx, p); err != nil {
		return nil, err
	}
	return p, nil
}

// launchPodRole starts a pod's role under the supervisor with its HTTP address
// chosen by the caller, without waiting for it (startPods waits for the pods by
// their events).
func (r *Runner) launchPodRole(name, bin, httpAddr string, args ...string) (*supervisor.Process, error) {
	path, lead, err := r.executable(bin)
	if err != nil {
		return nil, err
	}
	args = append([]string{"-nats-url", r.natsURL()}, args...)
	p := &supervisor.Process{Name: name, Bin: path, HTTP: httpAddr, Args: slices.Concat(lead, []string{"-http-addr", httpAddr}, args), Env: podEnv}
	return p, r.launch(p)
}

// launch starts p, logging to logs/<name>.log, without waiting for it.
func (r *Runner) launch(p *supervisor.Process) error {
	p.LogPath = r.logPath(p.Name)
	return r.sup.Launch(p)
}

func (r *Runner) logPath(name string) string {
	return filepath.Join(r.cfg.Dir, "logs", strings.ReplaceAll(name, "/", "_")+".log")
}

// start starts p, logging to logs/<name>.log, and waits for its /readyz.
func (r *Runner) start(ctx context.Context, p *supervisor.Process) error {
	p.LogPath = r.logPath(p.Name)
	fmt.Fprintf(r.out, "  %-22s starting, waiting for /readyz ...", p.Name)
	began := time.Now()
	if err := r.sup.Start(ctx, p, r.cfg.ReadyWait); err != nil {
		fmt.Fprintln(r.out, " failed")
		return err
	}
	fmt.Fprintf(r.out, " ready (%s)\n", time.Since(began).Round(time.Millisecond))
	r.log.Debug("service ready", "name", p.Name, "http", p.HTTP)
	return nil
}

// podRoles are the services the shared executable meshagent runs as subcommands.
var podRoles = []string{"sds-edge", "xds-relay", "launcher"}

// executable is what runs service bin: for a pod role, the shared executable
// meshagent with the role as its first argument when it is there (the pod's
// processes then share its code pages), else the service's own binary.
func (r *Runner) executable(bin string) (path string, lead []string, err error) {
	if slices.Contains(podRoles, bin) {
		if p, err := supervisor.FindBinary(r.cfg.BinDir, "meshagent"); err == nil {
			return p, []string{bin}, nil
		}
	}
	path, err = supervisor.FindBinary(r.cfg.BinDir, bin)
	return path, nil, err
}

func (r *Runner) startSigner(ctx context.Context) error {
	grpcAddr, err := supervisor.FreeAddr()
	if err != nil {
		return err
	}
	kek, err := CAKEK(r.cfg.Dir)
	if err != nil {
		return err
	}
	args := []string{
		"-instance", "signer-0",
		"-ca-kek-file", kek,
		"-trust-domain", r.cfg.TrustDomain,
		"-root-ttl", r.cfg.RootTTL.String(),
		"-root-check-interval", r.cfg.RootCheck.String(),
		"-stream-max-age", cmp.Or(r.cfg.EventsMaxAge, bus.DefaultEventStreamMaxAge).String(),
		"-grpc-addr", grpcAddr,
		"-jwks-file", r.Stack.TokenIssuer.JWKS,
		"-token-issuer", r.Stack.TokenIssuer.Issuer,
		"-token-audience", r.Stack.TokenIssuer.Audience,
		"-nats-nkey", r.creds.SeedFile(policy.Signer),
		"-bus-callout-seed", r.creds.IssuerFile(),
		"-bus-callout-nkey", r.creds.SeedFile(policy.Callout),
		// Pods are admitted by this signer's callout and verified offline (JWKS):
		// the identity subject proves what a per-request check would (docs/security.md).
		"-bus-sign-id",
	}
	if r.cfg.RootRotateMinInterval > 0 {
		args = append(args, "-root-rotate-min-interval", r.cfg.RootRotateMinInterval.String())
	}
	nodeArgs, err := r.startNodeAPI()
	if err != nil {
		return err
	}
	signerArgs, err := r.partnerSigner()
	if err != nil {
		return err
	}
	fedArgs, err := r.federation()
	if err != nil {
		return err
	}
	p, err := r.spawn(ctx, "signer", "signer", slices.Concat(args, nodeArgs, signerArgs, fedArgs)...)
	if err != nil {
		return err
	}
	r.Stack.Signer.Service, r.Stack.Signer.NATSSubject = stackfile.Service{HTTP: p.HTTP}, events.SignWildcard
	r.Stack.Signer.GRPCAddr, r.Stack.Signer.GRPCServerName = grpcAddr, "istiod.istio-system.svc"
	return nil
}

// CAKEK returns dir/secrets/ca-kek, the key-encryption key sealing the signer's CA
// key in KV: 32 random bytes, mode 0600, made on the first run and reused after, so
// the root in dir/nats survives restarts.
func CAKEK(dir string) (string, error) {
	secrets := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		return "", fmt.Errorf("secrets dir: %w", err)
	}
	p := filepath.Join(secrets, "ca-kek")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return p, nil // the signer checks its mode and content
	}
	if err != nil {
		return "", fmt.Errorf("ca kek: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		_ = f.Close()
		_ = os.Remove(p)
		return "", fmt.Errorf("ca kek: %w", err)
	}
	_, err = f.Write(key)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
		return "", fmt.Errorf("ca kek: %w", err)
	}
	return p, nil
}

func (r *Runner) startRotator(ctx context.Context) error {
	p, err := r.spawn(ctx, "rotator", "rotator", "-instance", "rotator-0", "-nats-nkey", r.creds.SeedFile(policy.Rotator))
	if err != nil {
		return err
	}
	r.Stack.Rotator = stackfile.Service{HTTP: p.HTTP}
	return nil
}

// DemoNamespace and DemoServiceAccount are the demo pods' (demoPod).
const DemoNamespace, DemoServiceAccount = "default", "demo"

// demoPod is demo pod id as the bus knows it.
func demoPod(id string) events.PodRef { return events.PodRef{Namespace: DemoNamespace, Name: id} }

func (r *Runner) startPod(id string) (*podStart, error) {
	const ns, sa = DemoNamespace, DemoServiceAccount
	root := filepath.Join(r.podsDir, id)
	pod := stackfile.Pod{
		ID: id, Namespace: ns, ServiceAccount: sa, Root: root,
		SDSSocket:   filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"),
		XDSSocket:   filepath.Join(root, "etc/istio/proxy/XDS"),
		TokenFile:   filepath.Join(root, "var/run/secrets/tokens/istio-token"),
		OutputCerts: filepath.Join(root, "etc/certs"),
		HTTP:        map[string]string{},
	}
	spiffe, err := pki.WorkloadID(r.cfg.TrustDomain, ns, sa)
	if err != nil {
		return nil, err
	}
	pod.SPIFFEID = spiffe.String()
	r.nodeAPI.Add(kubeapi.Pod{Namespace: ns, Name: id, ServiceAccount: sa, Node: Node})
	tok := kubelet.Token{File: pod.TokenFile, Namespace: ns, ServiceAccount: sa, Pod: id}
	r.kube.Tokens = append(r.kube.Tokens, tok)
	if err := r.kube.Write(tok, time.Now()); err != nil {
		return nil, err
	}
	common := []string{"-pod", id, "-pod-root", root}
	// On the bus a pod is its service-account token, checked by the signer's callout.
	onBus := func(args ...string) []string {
		return slices.Concat(common, []string{"-nats-token-file", pod.TokenFile}, args)
	}
	// The roles' HTTP addresses are chosen first: the launcher is told the others'.
	http, err := r.freeAddrs(3)
	if err != nil {
		return nil, err
	}
	sdsHTTP, relayHTTP := http[0], http[1]
	sdsArgs := onBus(
		"-trust-domain", r.cfg.TrustDomain, "-namespace", ns, "-service-account", sa,
		"-token-file", pod.TokenFile, "-secret-ttl", r.cfg.LeafTTL.String(), "-output-certs", pod.OutputCerts)
	// The relay serves the pod's DNS proxy from the control plane's name table
	// (Istio's DNS capture), on a port of its own since the demo pods share loopback.
	dnsAddr, err := r.freeAddrs(1)
	if err != nil {
		return nil, err
	}
	pod.DNS = dnsAddr[0]
	relayArgs := onBus("-discovery-address", r.Stack.ControlPlane.XDSAddr, "-xds-tls", "plaintext",
		"-dns-capture", "-dns-addr", pod.DNS, "-pod-namespace", ns)
	envoyBin, envoyKind, err := r.envoy()
	if err != nil {
		return nil, err
	}
	addrs, err := r.freeAddrs(3)
	if err != nil {
		return nil, err
	}
	pod.Envoy, pod.Status, pod.NodeID = envoyKind, addrs[0], NodeID(id, ns)
	launcherArgs := onBus(
		"-namespace", ns, "-service-account", sa, "-instance-ip", "127.0.0.1",
		"-sds-socket", pod.SDSSocket, "-xds-socket", pod.XDSSocket, "-relay-ready-url", "http://"+relayHTTP+"/readyz",
		"-sds-ready-url", "http://"+sdsHTTP+"/readyz",
		"-envoy-binary", envoyBin, "-status-addr", addrs[0], "-envoy-admin", addrs[1], "-envoy-stats-addr", addrs[2],
		"-output-certs", pod.OutputCerts, "-drain-time", "1s",
		"-pod-metrics-urls", "http://"+sdsHTTP+"/metrics,http://"+relayHTTP+"/metrics")
	pod.HTTP["sds-edge"], pod.HTTP["xds-relay"], pod.HTTP["launcher"] = sdsHTTP, relayHTTP, http[2]
	if r.cfg.OneProcessPods {
		// meshagent pod: the three roles in one process, each with its own flags.
		bin, err := supervisor.FindBinary(r.cfg.BinDir, "meshagent")
		if err != nil {
			return nil, fmt.Errorf("one-process pods need the meshagent executable (make build): %w", err)
		}
		role := func(name, httpAddr string, args []string) []string {
			return slices.Concat([]string{"--" + name, "-http-addr", httpAddr, "-nats-url", r.natsURL()}, args)
		}
		args := slices.Concat(role("sds-edge", sdsHTTP, sdsArgs), role("xds-relay", relayHTTP, relayArgs), role("launcher", http[2], launcherArgs))
		// Ready when the launcher is, which is after the other two.
		proc := &supervisor.Process{Name: id + "/pod", Bin: bin, HTTP: http[2], Args: append([]string{"pod"}, args...), Env: podEnv}
		if err := r.launch(proc); err != nil {
			return nil, err
		}
		r.Stack.Pods = append(r.Stack.Pods, pod)
		return &podStart{id: id, ps: []*supervisor.Process{proc}}, nil
	}
	ps := &podStart{id: id}
	for _, role := range []struct {
		name, http string
		args       []string
	}{{"sds-edge", sdsHTTP, sdsArgs}, {"xds-relay", relayHTTP, relayArgs}, {"launcher", http[2], launcherArgs}} {
		proc, err := r.launchPodRole(id+"/"+role.name, role.name, role.http, role.args...)
		if err != nil {
			return nil, err
		}
		ps.ps = append(ps.ps, proc)
	}
	r.Stack.Pods = append(r.Stack.Pods, pod)
	return ps, nil
}

// podEnv is the demo pods' environment beyond meshctl's: one scheduler thread
// each (a pod's processes idle but for a CSR, a push and an ADS stream, and up to
// fifty pods start at once on a laptop — as a sidecar is given a CPU limit of a
// core or less). The Envoy stand-in inherits it from the launcher.
var podEnv = []string{"GOMAXPROCS=1"}

// NodeID is the Envoy node id the launcher gives a demo pod: Istio's
// type~ip~pod.namespace~domain, with the loopback address meshctl up gives every pod.
func NodeID(pod, ns string) string {
	return "sidecar~127.0.0.1~" + pod + "." + ns + "~" + ns + ".svc.cluster.local"
}

// envoy returns the Envoy the launchers run and how to say it: a real Envoy when
// one is on PATH, else the stand-in built beside the services (bin/envoy-standin).
func (r *Runner) envoy() (path, kind string, err error) {
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, "Envoy " + p, nil
	}
	p, err := supervisor.FindBinary(r.cfg.BinDir, "envoy-standin")
	if err != nil {
		return "", "", fmt.Errorf("no envoy on PATH, and the stand-in: %w", err)
	}
	return p, "stand-in " + p + " (no envoy on PATH)", nil
}

// startControlPlane runs the demo xDS server in meshctl's own process: it stands for
// istiod, which the pods' relays connect to.
func (r *Runner) startControlPlane(ctx context.Context) error {
	var nodes []string
	for i := range r.cfg.Pods {
		id := fmt.Sprintf("demo-%d", i)
		nodes = append(nodes, "sidecar~"+id, NodeID(id, "default"))
	}
	cp := democp.New(democp.Config{Addr: "127.0.0.1:0", NodeIDs: nodes}, r.log.Named("democp"))
	cpctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(cpctx) }()
	r.stopCP = func() {
		cancel()
		<-done
	}
	select {
	case <-cp.Bound():
	case err := <-done:
		return fmt.Errorf("demo control plane: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	r.Stack.ControlPlane = &stackfile.ControlPlane{XDSAddr: cp.Addr().String()}
	return nil
}

// RefreshTokens re-mints every pod's token every half hour until ctx ends, as the
// kubelet refreshes a projected token.
func (r *Runner) RefreshTokens(ctx context.Context) {
	r.kube.Run(ctx, 30*time.Minute)
}

// writeBundle asks the signer for the trust bundle, writes it, and rewrites it on
// every trust.changed.
func (r *Runner) writeBundle(ctx context.Context) error {
	req, err := events.NewMsg(events.SubjectTrustBundle, "meshctl", events.BundleRequest{})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := r.nc.RequestMsgWithContext(rctx, req)
	if err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	reply, _, err := events.Decode[events.BundleReply](resp)
	if err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if reply.Error != nil {
		return fmt.Errorf("trust bundle: %w", reply.Error)
	}
	// The file follows trust.changed only when the event is endorsed by a root of the
	// bundle the signer gave us: whoever else gets a trust.changed onto the bus (a
	// leaked signer credential) cannot put a root into it.
	trust := trustbundle.New(r.cfg.TrustDomain, nil, nil)
	if _, _, err := trust.Accept(trustbundle.FromBundleReply(reply)); err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if err := writePEMs(r.Stack.TrustBundle, reply.Roots); err != nil {
		return err
	}
	_, err = r.nc.Subscribe(events.SubjectTrustChanged, func(m *nats.Msg) {
		tc, _, err := events.Decode[events.TrustChanged](m)
		var u trustbundle.Update
		if err == nil {
			u, _, err = trust.Accept(trustbundle.FromTrustChanged(tc))
		}
		if err != nil {
			r.log.Warn("trust.changed refused", "error", err)
			return
		}
		if u.Stale {
			return
		}
		if err := writePEMs(r.Stack.TrustBundle, tc.Roots); err != nil {
			r.log.Error("write trust bundle", "error", err)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe trust.changed: %w", err)
	}
	return nil
}

func writePEMs(path string, pems []string) error {
	var data []byte
	for _, p := range pems {
		data = append(data, p...)
	}
	return atomicfile.Write(path, data, 0o644)
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
