// Package config reads the launcher's configuration: flags, then env vars, then
// defaults. Where Istio's pilot-agent has a name for the same knob, the env var (or,
// for knobs Istio sets only by flag or ProxyConfig, the help text) uses it.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/flagenv/istioenv"
	"github.com/meshagent/meshagent/pkg/flagenv/pod"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
)

// Proxy types, as Istio's `pilot-agent proxy <type>`.
const (
	Sidecar = "sidecar"
	Router  = "router"
)

// Config is the launcher's whole configuration.
type Config struct {
	Log    obs.LogConfig
	Bus    bus.Config
	Listen struct {
		HTTP   string // /healthz, /readyz, /metrics of the launcher itself
		Status string // Istio's status port: /healthz/ready, /stats/prometheus, /quitquitquit, /drain, /app-health
	}
	Pod struct {
		pod.Config     // -pod, -pod-root: relative paths below are under the pod root
		Namespace      string
		ServiceAccount string
		ClusterID      string
		MeshID         string
		DNSDomain      string   // default <namespace>.svc.cluster.local
		IPs            []string // INSTANCE_IP, then the rest of INSTANCE_IPS
		Labels         map[string]string
		Type           string // sidecar or router
		RouterMode     string // a router's ROUTER_MODE metadata: standard or sni-dnat
		TokenFile      string // the pod's service-account token: its bus identity
		// Meta is every ISTIO_META_<NAME> of the environment (and of PROXY_CONFIG's
		// proxyMetadata), by NAME: node metadata as Istio's agent passes it on.
		Meta map[string]string
	}
	Envoy struct {
		Binary          string // path, or a name looked up on PATH; not found: proxyless
		Disabled        bool   // DISABLE_ENVOY: proxyless even when Envoy is there
		BootstrapPath   string
		CustomBootstrap string // used as is instead of the generated bootstrap
		Template        string // Go text/template rendered into the bootstrap
		AdminAddr       string
		StatsAddr       string // Envoy's own Prometheus listener (Istio: 15090)
		LogLevel        string
		ComponentLevel  string
		Concurrency     int
		DrainDuration   time.Duration // --drain-time-s
		ParentShutdown  time.Duration // --parent-shutdown-time-s
		UID, GID        int           // -1: keep the launcher's
		ExtraArgs       []string
	}
	Drain struct {
		// Duration is TERMINATION_DRAIN_DURATION: how long Envoy drains on SIGTERM.
		Duration time.Duration
		// ExitOnZero: drain until no downstream connection is left
		// (EXIT_ON_ZERO_ACTIVE_CONNECTIONS), after at least MinDuration.
		ExitOnZero   bool
		MinDuration  time.Duration
		PollInterval time.Duration
		// Deadline bounds the whole drain; Envoy is killed after it.
		Deadline time.Duration
	}
	Status struct {
		// AppProbers is ISTIO_KUBE_APP_PROBERS: the app's probes, served under
		// /app-health/<container>/<probe>.
		AppProbers string
		// MetricsURLs are the pod services' /metrics, merged into /stats/prometheus.
		MetricsURLs []string
		MaxScrape   int // bytes per scraped source
		// AppMetricsURL is the application's own metrics, merged last into
		// /stats/prometheus (Istio's ISTIO_PROMETHEUS_ANNOTATIONS: the pod's
		// prometheus.io/scrape, port and path); "" when not asked.
		AppMetricsURL string
		// AppTimeout bounds one scrape of the application.
		AppTimeout time.Duration
	}
	SDSSocket string
	XDSSocket string
	// CredentialSocket is a router's gateway credential socket (sds-edge's
	// -credential-socket); a router's bootstrap has a cluster for it.
	CredentialSocket string
	RelayReadyURL    string // xds-relay's /readyz; empty: only dial its socket
	SDSReadyURL      string // sds-edge's /readyz: default and ROOTCA held, default not expired
	OutputCerts      string // OUTPUT_CERTS: sds-edge's files, for proxyless gRPC
	GRPCBootstrap    string // GRPC_XDS_BOOTSTRAP: where the proxyless bootstrap goes
	// CertRefresh is how often a proxyless app re-reads OUTPUT_CERTS.
	CertRefresh time.Duration
	// WaitFor bounds how long to wait for sds-edge's certificates and the relay.
	WaitFor time.Duration
	// WatchEvery is how often, once Envoy runs, the launcher checks that sds-edge
	// and the relay still serve (readiness and a pod.parts event when that changes).
	WatchEvery time.Duration
}

// Default returns the defaults, as Istio lays out a pod.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	c.Listen.HTTP = "127.0.0.1:15021"
	c.Listen.Status = ":15020"
	c.Pod.RootDir = "."
	c.Pod.Namespace = "default"
	c.Pod.ServiceAccount = "default"
	c.Pod.ClusterID = "Kubernetes"
	c.Pod.Type = Sidecar
	c.Pod.TokenFile = "var/run/secrets/tokens/istio-token"
	c.Envoy.Binary = "envoy"
	c.Envoy.BootstrapPath = "etc/istio/proxy/envoy-rev.json"
	c.Envoy.AdminAddr = "127.0.0.1:15000"
	c.Envoy.StatsAddr = "0.0.0.0:15090"
	c.Envoy.LogLevel = "warning"
	c.Envoy.ComponentLevel = "misc:error"
	c.Envoy.Concurrency = 2
	c.Envoy.DrainDuration = 45 * time.Second
	c.Envoy.ParentShutdown = 60 * time.Second
	c.Envoy.UID, c.Envoy.GID = -1, -1
	c.Drain.Duration = 5 * time.Second
	c.Drain.MinDuration = 5 * time.Second
	c.Drain.PollInterval = time.Second
	c.Drain.Deadline = 60 * time.Second
	c.Status.MaxScrape = 8 << 20
	c.Status.AppTimeout = 5 * time.Second
	c.SDSSocket = "var/run/secrets/workload-spiffe-uds/socket"
	c.CredentialSocket = "var/run/secrets/workload-spiffe-uds/credential-socket"
	c.Pod.RouterMode = "standard"
	c.XDSSocket = "etc/istio/proxy/XDS"
	c.RelayReadyURL = "http://127.0.0.1:15022/readyz"
	c.SDSReadyURL = "http://127.0.0.1:15023/readyz"
	c.OutputCerts = "etc/istio-output-certs"
	c.GRPCBootstrap = "etc/istio/proxy/grpc-bootstrap.json"
	c.CertRefresh = 15 * time.Minute
	c.WaitFor = 2 * time.Minute
	c.WatchEvery = 2 * time.Second
	return c
}

// istioMetaPrefix begins the env vars Istio passes on as node metadata.
const istioMetaPrefix = "ISTIO_META_"

// Load reads flags and env vars over the defaults and validates the result.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Default()
	args, proxyType, err := proxyCommand(args)
	if err != nil {
		return c, err
	}
	var errs []error
	// PROXY_CONFIG (Istio's per-proxy ProxyConfig) sets the defaults its fields
	// name; an env var or a flag of the same knob overrides it.
	pc, getenv, err := istioenv.Load(getenv)
	if err != nil {
		errs = append(errs, err)
	}
	applyProxyConfig(&c, pc)
	fs := flagenv.New("launcher", getenv)
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	var labels, extra string
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "the launcher's own health and metrics listen address")
	fs.String(&c.Listen.Status, "status-addr", "STATUS_ADDR", c.Listen.Status,
		"status server (Istio: ProxyConfig statusPort, --statusPort; 15020): /healthz/ready, /stats/prometheus, /quitquitquit, /drain, /app-health; empty: off")
	c.Pod.Config.Bind(fs)
	fs.String(&c.Pod.Namespace, "namespace", "POD_NAMESPACE", c.Pod.Namespace, "pod namespace")
	fs.String(&c.Pod.ServiceAccount, "service-account", "SERVICE_ACCOUNT", c.Pod.ServiceAccount, "pod service account (node metadata)")
	fs.String(&c.Pod.ClusterID, "cluster-id", "ISTIO_META_CLUSTER_ID", c.Pod.ClusterID, "cluster id (node metadata CLUSTER_ID)")
	fs.String(&c.Pod.MeshID, "mesh-id", "ISTIO_META_MESH_ID", c.Pod.MeshID, "mesh id (node metadata MESH_ID)")
	fs.String(&c.Pod.DNSDomain, "domain", "DNS_DOMAIN", c.Pod.DNSDomain, "DNS domain of the node id (Istio: --domain); default <namespace>.svc.cluster.local")
	fs.List(&c.Pod.IPs, "instance-ip", "INSTANCE_IP", nil, "pod IP(s), comma-separated, first is the node id's (Istio: INSTANCE_IP; node metadata INSTANCE_IPS); default 127.0.0.1")
	fs.String(&labels, "labels", "ISTIO_METAJSON_LABELS", "", "pod labels as a JSON object (node metadata LABELS)")
	fs.String(&c.Pod.Type, "proxy-type", "PROXY_TYPE", c.Pod.Type, "sidecar or router (Istio: pilot-agent proxy <type>; also taken as leading arguments `proxy router`)")
	fs.String(&c.Pod.RouterMode, "router-mode", "ISTIO_META_ROUTER_MODE", c.Pod.RouterMode, "a router's mode, node metadata ROUTER_MODE: standard or sni-dnat")
	fs.String(&c.CredentialSocket, "credential-socket", "CREDENTIAL_SOCKET", c.CredentialSocket,
		"a router's gateway credential socket (sds-edge -gateway-credentials-dir), Envoy's cluster sds-external")
	fs.String(&c.Pod.TokenFile, "token-file", "TOKEN_FILE", c.Pod.TokenFile, "the pod's service-account token: the launcher's bus identity, as sds-edge's")
	fs.String(&c.Envoy.Binary, "envoy-binary", "ENVOY_BINARY", c.Envoy.Binary, "Envoy: a path or a name on PATH (Istio: ProxyConfig binaryPath, --binaryPath); not found: proxyless mode")
	fs.Bool(&c.Envoy.Disabled, "disable-envoy", "DISABLE_ENVOY", c.Envoy.Disabled, "proxyless mode: write a gRPC xDS bootstrap, start no Envoy (Istio: DISABLE_ENVOY)")
	fs.String(&c.Envoy.BootstrapPath, "bootstrap", "ENVOY_BOOTSTRAP", c.Envoy.BootstrapPath, "where to write Envoy's bootstrap (Istio: envoy-rev.json)")
	fs.String(&c.Envoy.CustomBootstrap, "custom-bootstrap", "CUSTOM_BOOTSTRAP", c.Envoy.CustomBootstrap, "use this bootstrap file as is (Istio: ProxyConfig customConfigFile)")
	fs.String(&c.Envoy.Template, "bootstrap-template", "ISTIO_BOOTSTRAP", c.Envoy.Template, "render this Go text/template into the bootstrap instead of building it (Istio: ISTIO_BOOTSTRAP)")
	fs.String(&c.Envoy.AdminAddr, "envoy-admin", "ENVOY_ADMIN_ADDR", c.Envoy.AdminAddr, "Envoy admin address (Istio: ProxyConfig proxyAdminPort 15000, loopback)")
	fs.String(&c.Envoy.StatsAddr, "envoy-stats-addr", "ENVOY_PROMETHEUS_ADDR", c.Envoy.StatsAddr, "Envoy's Prometheus stats listener (Istio: 15090); empty: none")
	fs.String(&c.Envoy.LogLevel, "proxy-log-level", "PROXY_LOG_LEVEL", c.Envoy.LogLevel, "Envoy -l (Istio: --proxyLogLevel)")
	fs.String(&c.Envoy.ComponentLevel, "proxy-component-log-level", "PROXY_COMPONENT_LOG_LEVEL", c.Envoy.ComponentLevel, "Envoy --component-log-level (Istio: --proxyComponentLogLevel)")
	fs.Int(&c.Envoy.Concurrency, "concurrency", "ISTIO_META_CONCURRENCY", c.Envoy.Concurrency, "Envoy --concurrency, 0: one per CPU (Istio: ProxyConfig concurrency, --concurrency)")
	fs.Duration(&c.Envoy.DrainDuration, "drain-duration", "DRAIN_DURATION", c.Envoy.DrainDuration, "Envoy --drain-time-s (Istio: ProxyConfig drainDuration)")
	fs.Duration(&c.Envoy.ParentShutdown, "parent-shutdown-duration", "PARENT_SHUTDOWN_DURATION", c.Envoy.ParentShutdown, "Envoy --parent-shutdown-time-s (Istio: ProxyConfig parentShutdownDuration)")
	fs.Int(&c.Envoy.UID, "envoy-uid", "ENVOY_UID", c.Envoy.UID, "run Envoy as this uid, e.g. 1337 as Istio's proxy (needs CAP_SETUID); -1: the launcher's")
	fs.Int(&c.Envoy.GID, "envoy-gid", "ENVOY_GID", c.Envoy.GID, "run Envoy as this gid, e.g. 1337; -1: the launcher's")
	fs.String(&extra, "envoy-extra-args", "ENVOY_EXTRA_ARGS", "", "more Envoy arguments, space-separated")
	fs.Duration(&c.Drain.Duration, "drain-time", "TERMINATION_DRAIN_DURATION", c.Drain.Duration, "on SIGTERM, drain Envoy this long, then stop it (Istio: ProxyConfig terminationDrainDuration, TERMINATION_DRAIN_DURATION)")
	fs.Bool(&c.Drain.ExitOnZero, "exit-on-zero-active-connections", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", c.Drain.ExitOnZero,
		"on SIGTERM, drain until Envoy has no downstream connection left instead of a fixed time (Istio: EXIT_ON_ZERO_ACTIVE_CONNECTIONS)")
	fs.Duration(&c.Drain.MinDuration, "minimum-drain-duration", "MINIMUM_DRAIN_DURATION", c.Drain.MinDuration, "with -exit-on-zero-active-connections: drain at least this long (Istio: MINIMUM_DRAIN_DURATION)")
	fs.Duration(&c.Drain.PollInterval, "drain-poll-interval", "DRAIN_POLL_INTERVAL", c.Drain.PollInterval, "how often to read downstream_cx_active while draining to zero")
	fs.Duration(&c.Drain.Deadline, "drain-deadline", "DRAIN_DEADLINE", c.Drain.Deadline, "hard bound on the whole drain; Envoy is killed after it (Istio: the pod's terminationGracePeriodSeconds)")
	fs.String(&c.Status.AppProbers, "app-probers", "ISTIO_KUBE_APP_PROBERS", c.Status.AppProbers, "the app's probes as JSON, served on the status port under their paths (Istio: ISTIO_KUBE_APP_PROBERS)")
	fs.List(&c.Status.MetricsURLs, "pod-metrics-urls", "POD_METRICS_URLS", nil, "the pod services' /metrics URLs, comma-separated, merged into /stats/prometheus (Istio: the agent's and app's metrics)")
	fs.Int(&c.Status.MaxScrape, "stats-max-bytes", "STATS_MAX_BYTES", c.Status.MaxScrape, "largest body read from one stats source for /stats/prometheus")
	var promAnnotations string
	fs.String(&promAnnotations, "prometheus-annotations", "ISTIO_PROMETHEUS_ANNOTATIONS", "",
		`the app's scrape settings as Istio's injector passes them, {"scrape":"true","port":"8080","path":"/metrics"}: the app's metrics (from localhost) are merged into /stats/prometheus (Istio: ISTIO_PROMETHEUS_ANNOTATIONS)`)
	fs.Duration(&c.Status.AppTimeout, "app-metrics-timeout", "APP_METRICS_TIMEOUT", c.Status.AppTimeout, "bound on one scrape of the app's metrics")
	fs.String(&c.SDSSocket, "sds-socket", "SDS_SOCKET", c.SDSSocket, "sds-edge's socket")
	fs.String(&c.XDSSocket, "xds-socket", "XDS_SOCKET", c.XDSSocket, "xds-relay's socket")
	fs.String(&c.SDSReadyURL, "sds-ready-url", "SDS_EDGE_READY_URL", c.SDSReadyURL, "sds-edge's /readyz, which is 200 once it holds default and ROOTCA (and default is not expired)")
	fs.String(&c.RelayReadyURL, "relay-ready-url", "XDS_RELAY_READY_URL", c.RelayReadyURL, "xds-relay's /readyz; empty: only dial its socket")
	fs.String(&c.OutputCerts, "output-certs", "OUTPUT_CERTS", c.OutputCerts, "sds-edge's certificate files (key.pem, cert-chain.pem, root-cert.pem), for proxyless gRPC (Istio: OUTPUT_CERTS)")
	fs.String(&c.GRPCBootstrap, "grpc-xds-bootstrap", "GRPC_XDS_BOOTSTRAP", c.GRPCBootstrap, "where proxyless mode writes the gRPC xDS bootstrap (Istio: GRPC_XDS_BOOTSTRAP)")
	fs.Duration(&c.CertRefresh, "grpc-cert-refresh", "GRPC_CERT_REFRESH_INTERVAL", c.CertRefresh, "how often a proxyless app re-reads the certificate files (file_watcher refresh_interval; Istio: 15m)")
	fs.Duration(&c.WatchEvery, "watch-every", "LAUNCHER_WATCH_INTERVAL", c.WatchEvery, "how often to check, once envoy runs, that sds-edge and the relay still serve")
	fs.Duration(&c.WaitFor, "wait-for", "LAUNCHER_WAIT", c.WaitFor, "how long to wait for sds-edge's certificates and the relay before giving up")
	istioFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		return c, errors.Join(append(errs, err)...)
	}
	if proxyType != "" {
		c.Pod.Type = proxyType
	}
	if len(c.Pod.IPs) == 0 {
		c.Pod.IPs = []string{"127.0.0.1"}
	}
	for _, ip := range c.Pod.IPs {
		if net.ParseIP(ip) == nil {
			errs = append(errs, fmt.Errorf("-instance-ip: %q is not an IP address", ip))
		}
	}
	// Istio's agent passes every ISTIO_META_* on as node metadata, named without
	// the prefix, its value a string (Envoy filters and istiod read them there).
	for _, n := range flagenv.Names(getenv, istioMetaPrefix) {
		if k := strings.TrimPrefix(n, istioMetaPrefix); k != "" {
			if c.Pod.Meta == nil {
				c.Pod.Meta = map[string]string{}
			}
			c.Pod.Meta[k] = getenv(n)
		}
	}
	if labels != "" {
		if err := json.Unmarshal([]byte(labels), &c.Pod.Labels); err != nil {
			errs = append(errs, fmt.Errorf("-labels: want a JSON object of strings: %v", err))
		}
	}
	c.Envoy.ExtraArgs = strings.Fields(extra)
	if u, err := appMetricsURL(promAnnotations); err != nil {
		errs = append(errs, fmt.Errorf("-prometheus-annotations: %w", err))
	} else {
		c.Status.AppMetricsURL = u
	}
	if c.Pod.DNSDomain == "" {
		c.Pod.DNSDomain = c.Pod.Namespace + ".svc.cluster.local"
	}
	c.SDSSocket = c.Pod.Path(c.SDSSocket)
	c.CredentialSocket = c.Pod.Path(c.CredentialSocket)
	c.XDSSocket = c.Pod.Path(c.XDSSocket)
	c.Envoy.BootstrapPath = c.Pod.Path(c.Envoy.BootstrapPath)
	c.OutputCerts = c.Pod.Path(c.OutputCerts)
	c.GRPCBootstrap = c.Pod.Path(c.GRPCBootstrap)
	c.Pod.TokenFile = c.Pod.Path(c.Pod.TokenFile)
	if c.Envoy.CustomBootstrap != "" {
		c.Envoy.CustomBootstrap = c.Pod.Path(c.Envoy.CustomBootstrap)
	}
	if c.Envoy.Template != "" {
		c.Envoy.Template = c.Pod.Path(c.Envoy.Template)
	}
	c.Bus.Name = "launcher/" + c.PodRef().String()
	c.Bus.AsPod(c.PodRef(), c.Pod.TokenFile)
	// The bus only carries the launcher's events (held until it connects): the
	// status port and Envoy must not wait for it (a pod the bus refuses still
	// starts, and its status port answers unready, as Istio's agent's does).
	c.Bus.Background = true
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// appMetricsURL is the app's metrics URL from ISTIO_PROMETHEUS_ANNOTATIONS
// (Istio's PrometheusScrapeConfiguration: scrape, port, path); "" when the app
// is not to be scraped. The app is always reached on localhost: the JSON picks a
// port and a path, never a host.
func appMetricsURL(v string) (string, error) {
	if strings.TrimSpace(v) == "" {
		return "", nil
	}
	var a struct {
		Scrape string `json:"scrape"`
		Port   string `json:"port"`
		Path   string `json:"path"`
	}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return "", fmt.Errorf(`want {"scrape":"true","port":"<port>","path":"<path>"}: %v`, err)
	}
	if a.Scrape != "true" {
		return "", nil
	}
	port, err := strconv.Atoi(a.Port)
	if err != nil || port <= 0 || port > 65535 {
		return "", fmt.Errorf("port %q: want a port number", a.Port)
	}
	if a.Path == "" {
		a.Path = "/metrics"
	}
	if !strings.HasPrefix(a.Path, "/") || strings.ContainsAny(a.Path, " #\r\n") {
		return "", fmt.Errorf("path %q: want an absolute path", a.Path)
	}
	u := "http://localhost:" + strconv.Itoa(port) + a.Path
	if _, err := url.Parse(u); err != nil {
		return "", fmt.Errorf("path %q: %v", a.Path, err)
	}
	return u, nil
}

// applyProxyConfig sets the defaults PROXY_CONFIG's fields name (Istio's
// ProxyConfig: statusPort, proxyAdminPort, drainDuration, terminationDrainDuration,
// binaryPath, concurrency); the launcher's own env vars and flags override them.
func applyProxyConfig(c *Config, pc istioenv.ProxyConfig) {
	if pc.StatusPort != nil {
		c.Listen.Status = ""
		if *pc.StatusPort != 0 { // Istio: statusPort 0 turns the status server off
			c.Listen.Status = fmt.Sprintf(":%d", *pc.StatusPort)
		}
	}
	if pc.ProxyAdminPort != nil && *pc.ProxyAdminPort != 0 {
		c.Envoy.AdminAddr = fmt.Sprintf("127.0.0.1:%d", *pc.ProxyAdminPort)
	}
	if pc.DrainDuration != nil {
		c.Envoy.DrainDuration = *pc.DrainDuration
	}
	if pc.TerminationDrainDuration != nil {
		c.Drain.Duration = *pc.TerminationDrainDuration
	}
	if pc.BinaryPath != "" {
		c.Envoy.Binary = pc.BinaryPath
	}
	if pc.Concurrency != nil {
		c.Envoy.Concurrency = int(*pc.Concurrency)
	}
}

// istioFlags are pilot-agent's `proxy` flags, as Istio's injection template
// passes them: the ones with a launcher knob set it, the rest are accepted and
// ignored (docs/istio.md says why).
func istioFlags(fs *flagenv.Set, c *Config) {
	f := fs.FS
	f.StringVar(&c.Envoy.LogLevel, "proxyLogLevel", c.Envoy.LogLevel, "Istio's name of -proxy-log-level")
	f.StringVar(&c.Envoy.ComponentLevel, "proxyComponentLogLevel", c.Envoy.ComponentLevel, "Istio's name of -proxy-component-log-level")
	f.BoolVar(&c.Log.JSON, "log_as_json", c.Log.JSON, "Istio's name of -log-json")
	var ignored string
	for _, n := range IgnoredIstioFlags {
		f.StringVar(&ignored, n, "", "Istio's pilot-agent flag, accepted and ignored (docs/istio.md)")
	}
}

// IgnoredIstioFlags are pilot-agent flags Istio's injection template passes that
// the launcher takes and ignores: the service cluster is the pod's labels, the
// agent's own log levels are -log-level, the STS server and the trust domain are
// sds-edge's (-trust-domain).
var IgnoredIstioFlags = []string{"serviceCluster", "log_output_level", "stsPort", "trust-domain", "outlierLogPath"}

// proxyCommand takes Istio's leading arguments `proxy <type>` (pilot-agent proxy
// router) off args, returning the rest and the type ("" when not given).
func proxyCommand(args []string) (rest []string, proxyType string, err error) {
	if len(args) == 0 || args[0] != "proxy" {
		return args, "", nil
	}
	if len(args) < 2 || (args[1] != Sidecar && args[1] != Router) {
		return nil, "", fmt.Errorf("proxy: want `proxy sidecar` or `proxy router` before the flags, got %q", strings.Join(args[:min(len(args), 2)], " "))
	}
	return args[2:], args[1], nil
}

// Process is what the lifecycle needs: the launcher is on the bus as its pod.
func (c Config) Process() lifecycle.Process {
	b := c.Bus
	return lifecycle.Process{Name: "launcher", Log: c.Log, LogWith: []any{"pod", c.PodRef().String()}, HTTP: c.Listen.HTTP, Bus: &b}
}

// PodRef is the launcher's pod as the bus knows it: its namespace (-namespace,
// POD_NAMESPACE) and name (-pod, POD_NAME).
func (c Config) PodRef() events.PodRef {
	return events.PodRef{Namespace: c.Pod.Namespace, Name: c.Pod.ID}
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	add := p.Addf
	p.Add(c.Log.Validate())
	p.Add(c.Bus.Validate())
	if c.Pod.ID == "" {
		add("-pod: required")
	} else if err := c.PodRef().Validate(); err != nil {
		add("-pod/-namespace: %v", err)
	}
	if c.Listen.HTTP == "" {
		add("-http-addr: required")
	}
	if u, err := url.Parse(c.SDSReadyURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add("-sds-ready-url: %q: want an http(s) URL (sds-edge's /readyz)", c.SDSReadyURL)
	}
	if c.Listen.Status != "" {
		if _, _, err := net.SplitHostPort(c.Listen.Status); err != nil {
			add("-status-addr: %q: want host:port", c.Listen.Status)
		}
	}
	if c.Pod.Type != Sidecar && c.Pod.Type != Router {
		add("-proxy-type: %q: want sidecar or router", c.Pod.Type)
	}
	if c.Pod.Type == Router && c.Pod.RouterMode != "standard" && c.Pod.RouterMode != "sni-dnat" {
		add("-router-mode: %q: want standard or sni-dnat", c.Pod.RouterMode)
	}
	if _, _, err := net.SplitHostPort(c.Envoy.AdminAddr); err != nil {
		add("-envoy-admin: %q: want host:port", c.Envoy.AdminAddr)
	}
	if c.Envoy.StatsAddr != "" {
		if _, _, err := net.SplitHostPort(c.Envoy.StatsAddr); err != nil {
			add("-envoy-stats-addr: %q: want host:port", c.Envoy.StatsAddr)
		}
	}
	if c.Envoy.CustomBootstrap != "" && c.Envoy.Template != "" {
		add("-custom-bootstrap, -bootstrap-template: set at most one")
	}
	if c.Envoy.Concurrency < 0 {
		add("-concurrency: must not be negative")
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"-drain-duration", c.Envoy.DrainDuration}, {"-parent-shutdown-duration", c.Envoy.ParentShutdown},
		{"-drain-time", c.Drain.Duration}, {"-minimum-drain-duration", c.Drain.MinDuration}} {
		if d.v < 0 {
			add("%s: must not be negative", d.flag)
		}
	}
	if c.Drain.PollInterval <= 0 {
		add("-drain-poll-interval: must be positive")
	}
	if c.Drain.Deadline <= 0 {
		add("-drain-deadline: must be positive")
	}
	if c.Envoy.UID < -1 || c.Envoy.GID < -1 {
		add("-envoy-uid, -envoy-gid: -1 or a uid/gid")
	}
	if c.Status.AppTimeout <= 0 {
		add("-app-metrics-timeout: must be positive")
	}
	if c.Status.MaxScrape <= 0 {
		add("-stats-max-bytes: must be positive")
	}
	if c.Status.AppProbers != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(c.Status.AppProbers), &m); err != nil {
			add("-app-probers: want a JSON object: %v", err)
		}
	}
	if c.CertRefresh <= 0 {
		add("-grpc-cert-refresh: must be positive")
	}
	if c.WaitFor <= 0 {
		add("-wait-for: must be positive")
	}
	if c.WatchEvery <= 0 {
		add("-watch-every: must be positive")
	}
	return p.Err()
}
