package config

import (
	"fmt"
	"strings"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/flagenv/istioenv"
)

// rawFlags are the flags read as text and parsed after the flags (resolve):
// their errors are reported together with the rest.
type rawFlags struct {
	labels          string // -labels: a JSON object
	extraArgs       string // -envoy-extra-args: space-separated
	promAnnotations string // -prometheus-annotations: Istio's scrape JSON
	cpuLimit        int    // -cpu-limit: ISTIO_CPU_LIMIT, Envoy's concurrency unless set otherwise
	// concurrencySet: -concurrency, its env var or PROXY_CONFIG's concurrency
	// was given, which -cpu-limit then does not override.
	concurrencySet bool
}

// bind defines every flag of the launcher on fs, each with its env var, over
// what c holds (the defaults and PROXY_CONFIG's).
func (c *Config) bind(fs *flagenv.Set, raw *rawFlags) {
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "the launcher's own health and metrics listen address")
	fs.String(&c.Listen.Status, "status-addr", "STATUS_ADDR", c.Listen.Status,
		"status server (Istio: ProxyConfig statusPort, --statusPort; 15020): /healthz/ready, /stats/prometheus, /quitquitquit, /drain, /app-health; empty: off")
	c.bindPod(fs, raw)
	c.bindEnvoy(fs, raw)
	c.bindDrain(fs)
	c.bindStatus(fs, raw)
	c.bindParts(fs)
	istioFlags(fs, c)
}

// bindPod defines the flags of the pod's identity and node metadata.
func (c *Config) bindPod(fs *flagenv.Set, raw *rawFlags) {
	c.Pod.Config.Bind(fs)
	fs.String(&c.Pod.Namespace, "namespace", "POD_NAMESPACE", c.Pod.Namespace, "pod namespace")
	fs.String(&c.Pod.ServiceAccount, "service-account", "SERVICE_ACCOUNT", c.Pod.ServiceAccount, "pod service account (node metadata)")
	fs.String(&c.Pod.ClusterID, "cluster-id", "ISTIO_META_CLUSTER_ID", c.Pod.ClusterID, "cluster id (node metadata CLUSTER_ID)")
	fs.String(&c.Pod.MeshID, "mesh-id", "ISTIO_META_MESH_ID", c.Pod.MeshID, "mesh id (node metadata MESH_ID)")
	fs.String(&c.Pod.DNSDomain, "domain", "DNS_DOMAIN", c.Pod.DNSDomain, "DNS domain of the node id (Istio: --domain); default <namespace>.svc.cluster.local")
	fs.List(&c.Pod.IPs, "instance-ip", "INSTANCE_IP", nil, "pod IP(s), comma-separated, first is the node id's (Istio: INSTANCE_IP; node metadata INSTANCE_IPS); default 127.0.0.1")
	fs.String(&raw.labels, "labels", "ISTIO_METAJSON_LABELS", "", "pod labels as a JSON object (node metadata LABELS)")
	fs.String(&c.Pod.LabelsFile, "pod-labels-file", "POD_LABELS_FILE", c.Pod.LabelsFile,
		"the pod's labels as Istio's injection template mounts them (downward API, key=\"value\" lines), merged over -labels into node metadata LABELS as pilot-agent does; missing: only -labels")
	fs.String(&c.Pod.Type, "proxy-type", "PROXY_TYPE", c.Pod.Type, "sidecar or router (Istio: pilot-agent proxy <type>; also taken as leading arguments `proxy router`)")
	fs.String(&c.Pod.RouterMode, "router-mode", "ISTIO_META_ROUTER_MODE", c.Pod.RouterMode, "a router's mode, node metadata ROUTER_MODE: standard or sni-dnat")
	fs.String(&c.CredentialSocket, "credential-socket", "CREDENTIAL_SOCKET", c.CredentialSocket,
		"a router's gateway credential socket (sds-edge -gateway-credentials-dir), Envoy's cluster sds-external")
	fs.String(&c.Pod.TokenFile, "token-file", "TOKEN_FILE", c.Pod.TokenFile, "the pod's service-account token: the launcher's bus identity, as sds-edge's")
}

// bindEnvoy defines the flags of Envoy's process and bootstrap.
func (c *Config) bindEnvoy(fs *flagenv.Set, raw *rawFlags) {
	fs.String(&c.Envoy.Binary, "envoy-binary", "ENVOY_BINARY", c.Envoy.Binary, "Envoy: a path or a name on PATH (Istio: ProxyConfig binaryPath, --binaryPath); not found: proxyless mode")
	fs.Bool(&c.Envoy.Disabled, "disable-envoy", "DISABLE_ENVOY", c.Envoy.Disabled, "proxyless mode: write a gRPC xDS bootstrap, start no Envoy (Istio: DISABLE_ENVOY)")
	fs.String(&c.Envoy.BootstrapPath, "bootstrap", "ENVOY_BOOTSTRAP", c.Envoy.BootstrapPath, "where to write Envoy's bootstrap (Istio: envoy-rev.json)")
	fs.String(&c.Envoy.CustomBootstrap, "custom-bootstrap", "CUSTOM_BOOTSTRAP", c.Envoy.CustomBootstrap, "use this bootstrap file as is (Istio: ProxyConfig customConfigFile)")
	fs.String(&c.Envoy.Template, "bootstrap-template", "ISTIO_BOOTSTRAP", c.Envoy.Template, "render this Go text/template into the bootstrap instead of building it (Istio: ISTIO_BOOTSTRAP)")
	fs.String(&c.Envoy.AdminAddr, "envoy-admin", "ENVOY_ADMIN_ADDR", c.Envoy.AdminAddr, "Envoy admin address (Istio: ProxyConfig proxyAdminPort 15000, loopback)")
	fs.String(&c.Envoy.StatsAddr, "envoy-stats-addr", "ENVOY_PROMETHEUS_ADDR", c.Envoy.StatsAddr, "Envoy's Prometheus stats listener (Istio: 15090); empty: none")
	fs.String(&c.Envoy.LogLevel, "proxy-log-level", "PROXY_LOG_LEVEL", c.Envoy.LogLevel, "Envoy -l (Istio: --proxyLogLevel)")
	fs.String(&c.Envoy.ComponentLevel, "proxy-component-log-level", "PROXY_COMPONENT_LOG_LEVEL", c.Envoy.ComponentLevel, "Envoy --component-log-level (Istio: --proxyComponentLogLevel)")
	fs.Int(&c.Envoy.Concurrency, "concurrency", "ISTIO_META_CONCURRENCY", c.Envoy.Concurrency, "Envoy --concurrency, 0: one per CPU (Istio: ProxyConfig concurrency, --concurrency); default -cpu-limit when set, else 2")
	fs.Int(&raw.cpuLimit, "cpu-limit", "ISTIO_CPU_LIMIT", 0,
		"the proxy container's CPU limit, whole CPUs rounded up (Istio's injection template sets it from the downward API): Envoy's --concurrency when neither -concurrency nor PROXY_CONFIG's concurrency is set, as pilot-agent; 0: none")
	fs.Duration(&c.Envoy.DrainDuration, "drain-duration", "DRAIN_DURATION", c.Envoy.DrainDuration, "Envoy --drain-time-s (Istio: ProxyConfig drainDuration)")
	fs.Duration(&c.Envoy.ParentShutdown, "parent-shutdown-duration", "PARENT_SHUTDOWN_DURATION", c.Envoy.ParentShutdown, "Envoy --parent-shutdown-time-s (Istio: ProxyConfig parentShutdownDuration)")
	fs.Int(&c.Envoy.UID, "envoy-uid", "ENVOY_UID", c.Envoy.UID, "run Envoy as this uid, e.g. 1337 as Istio's proxy (needs CAP_SETUID); -1: the launcher's")
	fs.Int(&c.Envoy.GID, "envoy-gid", "ENVOY_GID", c.Envoy.GID, "run Envoy as this gid, e.g. 1337; -1: the launcher's")
	fs.String(&raw.extraArgs, "envoy-extra-args", "ENVOY_EXTRA_ARGS", "", "more Envoy arguments, space-separated")
}

// bindDrain defines the flags of the drain on SIGTERM.
func (c *Config) bindDrain(fs *flagenv.Set) {
	fs.Duration(&c.Drain.Duration, "drain-time", "TERMINATION_DRAIN_DURATION", c.Drain.Duration, "on SIGTERM, drain Envoy this long, then stop it (Istio: ProxyConfig terminationDrainDuration, TERMINATION_DRAIN_DURATION)")
	fs.Bool(&c.Drain.ExitOnZero, "exit-on-zero-active-connections", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", c.Drain.ExitOnZero,
		"on SIGTERM, drain until Envoy has no downstream connection left instead of a fixed time (Istio: EXIT_ON_ZERO_ACTIVE_CONNECTIONS)")
	fs.Duration(&c.Drain.MinDuration, "minimum-drain-duration", "MINIMUM_DRAIN_DURATION", c.Drain.MinDuration, "with -exit-on-zero-active-connections: drain at least this long (Istio: MINIMUM_DRAIN_DURATION)")
	fs.Duration(&c.Drain.PollInterval, "drain-poll-interval", "DRAIN_POLL_INTERVAL", c.Drain.PollInterval, "how often to read downstream_cx_active while draining to zero")
	fs.Duration(&c.Drain.Deadline, "drain-deadline", "DRAIN_DEADLINE", c.Drain.Deadline, "hard bound on the whole drain; Envoy is killed after it (Istio: the pod's terminationGracePeriodSeconds)")
}

// bindStatus defines the flags of the status port's probes and merged stats.
func (c *Config) bindStatus(fs *flagenv.Set, raw *rawFlags) {
	fs.String(&c.Status.AppProbers, "app-probers", "ISTIO_KUBE_APP_PROBERS", c.Status.AppProbers, "the app's probes as JSON, served on the status port under their paths (Istio: ISTIO_KUBE_APP_PROBERS)")
	fs.List(&c.Status.MetricsURLs, "pod-metrics-urls", "POD_METRICS_URLS", nil, "the pod services' /metrics URLs, comma-separated, merged into /stats/prometheus (Istio: the agent's and app's metrics)")
	fs.Int(&c.Status.MaxScrape, "stats-max-bytes", "STATS_MAX_BYTES", c.Status.MaxScrape, "largest body read from one stats source for /stats/prometheus")
	fs.String(&raw.promAnnotations, "prometheus-annotations", "ISTIO_PROMETHEUS_ANNOTATIONS", "",
		`the app's scrape settings as Istio's injector passes them, {"scrape":"true","port":"8080","path":"/metrics"}: the app's metrics (from localhost) are merged into /stats/prometheus (Istio: ISTIO_PROMETHEUS_ANNOTATIONS)`)
	fs.Duration(&c.Status.AppTimeout, "app-metrics-timeout", "APP_METRICS_TIMEOUT", c.Status.AppTimeout, "bound on one scrape of the app's metrics")
}

// bindParts defines the flags of the pod's other parts: sds-edge, xds-relay, and
// what a proxyless app reads.
func (c *Config) bindParts(fs *flagenv.Set) {
	fs.String(&c.SDSSocket, "sds-socket", "SDS_SOCKET", c.SDSSocket, "sds-edge's socket")
	fs.String(&c.XDSSocket, "xds-socket", "XDS_SOCKET", c.XDSSocket, "xds-relay's socket")
	fs.String(&c.SDSReadyURL, "sds-ready-url", "SDS_EDGE_READY_URL", c.SDSReadyURL, "sds-edge's /readyz, which is 200 once it holds default and ROOTCA (and default is not expired)")
	fs.String(&c.RelayReadyURL, "relay-ready-url", "XDS_RELAY_READY_URL", c.RelayReadyURL, "xds-relay's /readyz; empty: only dial its socket")
	fs.String(&c.OutputCerts, "output-certs", "OUTPUT_CERTS", c.OutputCerts, "sds-edge's certificate files (key.pem, cert-chain.pem, root-cert.pem), for proxyless gRPC (Istio: OUTPUT_CERTS)")
	fs.String(&c.GRPCBootstrap, "grpc-xds-bootstrap", "GRPC_XDS_BOOTSTRAP", c.GRPCBootstrap, "where proxyless mode writes the gRPC xDS bootstrap (Istio: GRPC_XDS_BOOTSTRAP)")
	fs.Duration(&c.CertRefresh, "grpc-cert-refresh", "GRPC_CERT_REFRESH_INTERVAL", c.CertRefresh, "how often a proxyless app re-reads the certificate files (file_watcher refresh_interval; Istio: 15m)")
	fs.Duration(&c.WatchEvery, "watch-every", "LAUNCHER_WATCH_INTERVAL", c.WatchEvery, "how often to check, once envoy runs, that sds-edge and the relay still serve")
	fs.Duration(&c.WaitFor, "wait-for", "LAUNCHER_WAIT", c.WaitFor, "how long to wait for sds-edge's certificates and the relay before giving up")
}

// applyProxyConfig sets the defaults PROXY_CONFIG's fields name (Istio's
// ProxyConfig: statusPort, proxyAdminPort, drainDuration, terminationDrainDuration,
// binaryPath, concurrency); the launcher's own env vars and flags override them.
func applyProxyConfig(c *Config, pc istioenv.ProxyConfig) {
	c.Pod.ProxyConfig = pc.JSON
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
