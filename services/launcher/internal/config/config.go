// Package config reads the launcher's configuration: flags, then env vars, then
// defaults. Where Istio's pilot-agent has a name for the same knob, the env var (or,
// for knobs Istio sets only by flag or ProxyConfig, the help text) uses it.
package config

import (
	"encoding/json"
	"errors"
	"flag"
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
		LabelsFile     string // downward-API labels, merged over Labels
		Type           string // sidecar or router
		RouterMode     string // a router's ROUTER_MODE metadata: standard or sni-dnat
		TokenFile      string // the pod's service-account token: its bus identity
		// Meta is every ISTIO_META_<NAME> of the environment (and of PROXY_CONFIG's
		// proxyMetadata), by NAME: node metadata as Istio's agent passes it on.
		Meta map[string]string
		// ProxyConfig is PROXY_CONFIG as a JSON object (nil when unset), the
		// PROXY_CONFIG node metadata, as Istio's agent puts it there.
		ProxyConfig json.RawMessage
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
	c.Pod.LabelsFile = PodLabelsFile
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
	var raw rawFlags
	c.bind(fs, &raw)
	if err := fs.Parse(args); err != nil {
		return c, errors.Join(append(errs, err)...)
	}
	if proxyType != "" {
		c.Pod.Type = proxyType
	}
	raw.concurrencySet = pc.Concurrency != nil || getenv("ISTIO_META_CONCURRENCY") != ""
	fs.FS.Visit(func(f *flag.Flag) { raw.concurrencySet = raw.concurrencySet || f.Name == "concurrency" })
	errs = append(errs, c.resolve(raw, getenv)...)
	c.underPodRoot()
	if c.Pod.Labels, err = readPodLabels(c.Pod.LabelsFile, c.Pod.Labels); err != nil {
		errs = append(errs, err)
	}
	c.Bus.Name = "launcher/" + c.PodRef().String()
	c.Bus.AsPod(c.PodRef(), c.Pod.TokenFile)
	c.Bus.NodeLocal = getenv(bus.ViaNodeEnv) != ""
	// The bus only carries the launcher's events (held until it connects): the
	// status port and Envoy must not wait for it (a pod the bus refuses still
	// starts, and its status port answers unready, as Istio's agent's does).
	c.Bus.Background = true
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// resolve completes c from the parsed flags: the pod's IPs, node metadata and
// labels, Envoy's extra arguments, the app's metrics URL and the DNS domain. It
// returns what does not parse.
func (c *Config) resolve(raw rawFlags, getenv func(string) string) []error {
	var errs []error
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
	if raw.labels != "" {
		if err := json.Unmarshal([]byte(raw.labels), &c.Pod.Labels); err != nil {
			errs = append(errs, fmt.Errorf("-labels: want a JSON object of strings: %v", err))
		}
	}
	c.Envoy.ExtraArgs = strings.Fields(raw.extraArgs)
	// pilot-agent: an unset ProxyConfig concurrency is the CPU limit, so that a
	// proxy limited to 2 CPUs on a 64-core node runs 2 worker threads, not 64.
	if raw.cpuLimit < 0 {
		errs = append(errs, fmt.Errorf("-cpu-limit: %d is negative", raw.cpuLimit))
	} else if raw.cpuLimit > 0 && !raw.concurrencySet {
		c.Envoy.Concurrency = raw.cpuLimit
	}
	if u, err := appMetricsURL(raw.promAnnotations); err != nil {
		errs = append(errs, fmt.Errorf("-prometheus-annotations: %w", err))
	} else {
		c.Status.AppMetricsURL = u
	}
	if c.Pod.DNSDomain == "" {
		c.Pod.DNSDomain = c.Pod.Namespace + ".svc.cluster.local"
	}
	return errs
}

// underPodRoot makes the relative paths c names relative to the pod root.
func (c *Config) underPodRoot() {
	c.SDSSocket = c.Pod.Path(c.SDSSocket)
	c.CredentialSocket = c.Pod.Path(c.CredentialSocket)
	c.XDSSocket = c.Pod.Path(c.XDSSocket)
	c.Envoy.BootstrapPath = c.Pod.Path(c.Envoy.BootstrapPath)
	c.OutputCerts = c.Pod.Path(c.OutputCerts)
	c.GRPCBootstrap = c.Pod.Path(c.GRPCBootstrap)
	c.Pod.TokenFile = c.Pod.Path(c.Pod.TokenFile)
	c.Pod.LabelsFile = c.Pod.Path(c.Pod.LabelsFile)
	if c.Envoy.CustomBootstrap != "" {
		c.Envoy.CustomBootstrap = c.Pod.Path(c.Envoy.CustomBootstrap)
	}
	if c.Envoy.Template != "" {
		c.Envoy.Template = c.Pod.Path(c.Envoy.Template)
	}
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
	p.Add(c.Log.Validate())
	p.Add(c.Bus.Validate())
	c.checkPod(&p)
	c.checkEnvoy(&p)
	c.checkDrain(&p)
	c.checkStatus(&p)
	p.Check(c.CertRefresh > 0, "-grpc-cert-refresh: must be positive")
	p.Check(c.WaitFor > 0, "-wait-for: must be positive")
	p.Check(c.WatchEvery > 0, "-watch-every: must be positive")
	return p.Err()
}

// checkPod checks the pod's name, type and the launcher's own addresses.
func (c Config) checkPod(p *flagenv.Problems) {
	if c.Pod.ID == "" {
		p.Addf("-pod: required")
	} else if err := c.PodRef().Validate(); err != nil {
		p.Addf("-pod/-namespace: %v", err)
	}
	p.Check(c.Listen.HTTP != "", "-http-addr: required")
	if u, err := url.Parse(c.SDSReadyURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.Addf("-sds-ready-url: %q: want an http(s) URL (sds-edge's /readyz)", c.SDSReadyURL)
	}
	if c.Listen.Status != "" {
		checkHostPort(p, "-status-addr", c.Listen.Status)
	}
	p.Check(c.Pod.Type == Sidecar || c.Pod.Type == Router, "-proxy-type: %q: want sidecar or router", c.Pod.Type)
	if c.Pod.Type == Router && c.Pod.RouterMode != "standard" && c.Pod.RouterMode != "sni-dnat" {
		p.Addf("-router-mode: %q: want standard or sni-dnat", c.Pod.RouterMode)
	}
}

// checkEnvoy checks Envoy's addresses, bootstrap and process settings.
func (c Config) checkEnvoy(p *flagenv.Problems) {
	checkHostPort(p, "-envoy-admin", c.Envoy.AdminAddr)
	if c.Envoy.StatsAddr != "" {
		checkHostPort(p, "-envoy-stats-addr", c.Envoy.StatsAddr)
	}
	p.Check(c.Envoy.CustomBootstrap == "" || c.Envoy.Template == "", "-custom-bootstrap, -bootstrap-template: set at most one")
	p.Check(c.Envoy.Concurrency >= 0, "-concurrency: must not be negative")
	p.Check(c.Envoy.UID >= -1 && c.Envoy.GID >= -1, "-envoy-uid, -envoy-gid: -1 or a uid/gid")
}

// checkDrain checks the drain's durations.
func (c Config) checkDrain(p *flagenv.Problems) {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"-drain-duration", c.Envoy.DrainDuration}, {"-parent-shutdown-duration", c.Envoy.ParentShutdown},
		{"-drain-time", c.Drain.Duration}, {"-minimum-drain-duration", c.Drain.MinDuration}} {
		p.Check(d.v >= 0, "%s: must not be negative", d.flag)
	}
	p.Check(c.Drain.PollInterval > 0, "-drain-poll-interval: must be positive")
	p.Check(c.Drain.Deadline > 0, "-drain-deadline: must be positive")
}

// checkStatus checks the status port's scrapes and the app's probes.
func (c Config) checkStatus(p *flagenv.Problems) {
	p.Check(c.Status.AppTimeout > 0, "-app-metrics-timeout: must be positive")
	p.Check(c.Status.MaxScrape > 0, "-stats-max-bytes: must be positive")
	if c.Status.AppProbers != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(c.Status.AppProbers), &m); err != nil {
			p.Addf("-app-probers: want a JSON object: %v", err)
		}
	}
}

// checkHostPort reports flag's value v unless it is host:port.
func checkHostPort(p *flagenv.Problems, flag, v string) {
	if _, _, err := net.SplitHostPort(v); err != nil {
		p.Addf("%s: %q: want host:port", flag, v)
	}
}
