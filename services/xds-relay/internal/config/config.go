// Package config reads xds-relay's configuration: flags, then env vars, then defaults.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
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

// HeaderEnvPrefix marks env vars sent upstream as metadata: XDS_HEADER_FOO=bar sends foo: bar.
const HeaderEnvPrefix = "XDS_HEADER_"

// Upstream security modes; Auto is plaintext for a :15010 address, else mtls (as Istio).
const (
	ModeAuto      = "auto"
	ModePlaintext = "plaintext"
	ModeTLS       = "tls"
	ModeMTLS      = "mtls"
)

// Config is xds-relay's whole configuration.
type Config struct {
	Log    obs.LogConfig
	Bus    bus.Config
	Listen struct {
		HTTP string
	}
	Pod      pod.Config // id and root (relative paths below are under it), as every pod-side process reads them
	Socket   string     // the ADS socket Envoy connects to
	Upstream struct {
		Address        string
		Mode           string
		RootCA         string // file, "SYSTEM", or empty: ROOTCA from sds-edge
		ServerName     string
		TokenFile      string
		ClusterID      string
		Headers        map[string]string
		ConnectTimeout time.Duration
		// CertProvider is Istio's PILOT_CERT_PROVIDER: which roots verify the
		// discovery server when -xds-root-ca is not given.
		CertProvider string
		// Auth is Istio's XDS_AUTH: send a token upstream.
		Auth bool
	}
	SDSSocket  string // the pod's sds-edge, for the workload certificate and ROOTCA
	MaxMsgSize int
	// DNS is the pod's DNS proxy (Istio's DNS capture): when Capture is set the
	// relay asks the control plane for the name table and serves DNS from it.
	DNS struct {
		Capture    bool
		Addr       string
		ResolvConf string
		Namespace  string
	}
	Wasm Wasm // ECDS's Wasm remote load (wasm.go)
	// DebugTap is Istio's PROXY_XDS_DEBUG_VIA_AGENT: the pod's debug tap, which
	// answers istio.io/debug questions on localhost:Port by asking the discovery
	// server on Envoy's ADS stream.
	DebugTap struct {
		Enabled bool
		Port    int
	}
	// Health is Istio's workload health checking: with ProxyConfig's
	// readinessProbe (PROXY_CONFIG) the relay probes the app and reports its
	// health to the discovery server on Envoy's ADS stream.
	Health struct {
		Probe *istioenv.ReadinessProbe // nil: no health checks
		// IPs are the workload's (INSTANCE_IP); a probe naming no host goes to the first.
		IPs []string
		// EnvoyAdmin is Envoy's admin address, whose /ready gates health as Istio's
		// agent probes Envoy first; empty: not probed (no Envoy, proxyless gRPC).
		EnvoyAdmin string
	}
}

// PodTokenFile is where a pod's service-account token is, under the pod root (Istio's
// istio-token, which sds-edge also uses); the relay connects to the bus with it.
const PodTokenFile = "var/run/secrets/tokens/istio-token"

// Istio's PILOT_CERT_PROVIDER values.
const (
	CertProviderIstiod     = "istiod"
	CertProviderKubernetes = "kubernetes"
	CertProviderCustom     = "custom"
)

// MountedRootCert is Istio's DefaultRootCertFilePath: a root file mounted into
// the pod, which Istio's agent prefers for the discovery server when XDS_ROOT_CA
// is unset.
const MountedRootCert = "etc/certs/root-cert.pem"

// certProviderRoots is the default -xds-root-ca of each PILOT_CERT_PROVIDER, as
// Istio's agent picks the discovery server's roots (empty: the mesh roots from
// sds-edge, which is what istiod's /var/run/secrets/istio/root-cert.pem holds).
var certProviderRoots = map[string]string{
	CertProviderIstiod:     "",
	CertProviderKubernetes: "var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
	CertProviderCustom:     MountedRootCert,
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// Default returns the defaults, as Istio lays out a pod.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	c.Bus.URL = bus.DefaultURL
	c.Listen.HTTP = "127.0.0.1:15022"
	c.Pod.RootDir = pod.DefaultRoot
	c.Socket = "etc/istio/proxy/XDS"
	c.Upstream.Address = "istiod.istio-system.svc:15012"
	c.Upstream.Mode = ModeAuto
	c.Upstream.ClusterID = "Kubernetes"
	c.Upstream.ConnectTimeout = 10 * time.Second
	c.SDSSocket = "var/run/secrets/workload-spiffe-uds/socket"
	c.MaxMsgSize = 64 << 20
	c.DNS.Addr = "127.0.0.1:15053"
	c.DNS.ResolvConf = "/etc/resolv.conf"
	c.DNS.Namespace = "default"
	c.Wasm = defaultWasm()
	c.DebugTap.Enabled = true
	c.DebugTap.Port = 15004
	c.Health.EnvoyAdmin = "127.0.0.1:15000"
	return c
}

// Load reads flags and env vars over the defaults, resolves paths under the pod
// root and validates the result. The XDS_HEADER_* variables are read through
// getenv like every other knob; since getenv cannot list names, which of them
// exist is taken from the process environment (os.Environ), and one whose value
// getenv reports empty is left out.
func Load(args []string, getenv func(string) string) (Config, error) {
	return load(args, getenv, os.Environ())
}

// load is Load with the environment that lists the XDS_HEADER_* names.
func load(args []string, getenv func(string) string, environ []string) (Config, error) {
	c := Default()
	// PROXY_CONFIG's discoveryAddress is the default address (and its
	// proxyMetadata env under the container's); DISCOVERY_ADDRESS or the flag
	// overrides it.
	pc, getenv, pcErr := istioenv.Load(getenv)
	if pc.DiscoveryAddress != "" {
		c.Upstream.Address = pc.DiscoveryAddress
	}
	c.Health.Probe = pc.ReadinessProbe
	if pc.ProxyAdminPort != nil && *pc.ProxyAdminPort != 0 {
		c.Health.EnvoyAdmin = fmt.Sprintf("127.0.0.1:%d", *pc.ProxyAdminPort)
	}
	// Its controlPlaneAuthPolicy is the default security, as Istio's agent dials:
	// NONE plaintext, MUTUAL_TLS mutual TLS; XDS_TLS or the flag overrides it.
	switch pc.ControlPlaneAuthPolicy {
	case "NONE":
		c.Upstream.Mode = ModePlaintext
	case "MUTUAL_TLS":
		c.Upstream.Mode = ModeMTLS
	}
	fs := flagenv.New("xds-relay", getenv)
	c.bind(fs)
	if err := fs.Parse(args); err != nil {
		return c, errors.Join(pcErr, err)
	}
	if pcErr != nil {
		return c, pcErr
	}
	tokenGiven := c.Upstream.TokenFile != ""
	c.upstreamDefaults()
	c.Upstream.Headers = headers(environ, getenv)
	c.underPodRoot()
	c.Bus.Name = "xds-relay/" + c.PodRef().String()
	// On the bus the relay is its pod: the pod's service-account token (as sds-edge).
	busToken := c.Upstream.TokenFile
	if busToken == "" {
		busToken = c.Pod.Path(PodTokenFile)
	}
	c.Bus.AsPod(c.PodRef(), busToken)
	c.Bus.NodeLocal = getenv(bus.ViaNodeEnv) != ""
	if !c.Upstream.Auth {
		if tokenGiven {
			return c, errors.Join(c.Validate(), errors.New("-xds-auth=false (XDS_AUTH): not with -token-file, which sends a token"))
		}
		c.Upstream.TokenFile = ""
	}
	if c.Upstream.Mode == ModeAuto {
		c.Upstream.Mode = ModeMTLS
		if _, port, err := net.SplitHostPort(c.Upstream.Address); err == nil && port == "15010" {
			c.Upstream.Mode = ModePlaintext
		}
	}
	return c, c.Validate()
}

// bind defines every flag of the relay on fs, each with its env var, over what c
// holds (the defaults and PROXY_CONFIG's).
func (c *Config) bind(fs *flagenv.Set) {
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "health and metrics listen address")
	c.Pod.Bind(fs)
	fs.String(&c.Socket, "socket", "XDS_SOCKET", c.Socket, "ADS socket Envoy connects to (under -pod-root if relative)")
	fs.String(&c.Upstream.Address, "discovery-address", "DISCOVERY_ADDRESS", c.Upstream.Address, "upstream discovery server host:port (Istio: ProxyConfig discoveryAddress in PROXY_CONFIG)")
	fs.String(&c.Upstream.CertProvider, "pilot-cert-provider", "PILOT_CERT_PROVIDER", CertProviderIstiod,
		"whose CA signed the discovery server's certificate, the default of -xds-root-ca as in Istio: istiod (the mesh roots from sds-edge), kubernetes (the service account's ca.crt), custom (etc/certs/root-cert.pem)")
	fs.Bool(&c.Upstream.Auth, "xds-auth", "XDS_AUTH", true,
		"send a token upstream (Istio: XDS_AUTH): -token-file, or else, over TLS only, the pod's service-account token when it exists")
	fs.String(&c.Upstream.Mode, "xds-tls", "XDS_TLS", c.Upstream.Mode, "upstream security: auto, plaintext, tls or mtls (auto: plaintext on :15010, else mtls)")
	fs.String(&c.Upstream.RootCA, "xds-root-ca", "XDS_ROOT_CA", c.Upstream.RootCA, "PEM file of the upstream's CA, SYSTEM, or empty for the mesh ROOTCA from sds-edge")
	fs.String(&c.Upstream.ServerName, "xds-server-name", "XDS_SERVER_NAME", c.Upstream.ServerName, "name to verify in the upstream's certificate (default: host of -discovery-address)")
	fs.String(&c.Upstream.TokenFile, "token-file", "XDS_TOKEN_FILE", c.Upstream.TokenFile, "bearer token file sent upstream, re-read per connection (under -pod-root if relative)")
	fs.String(&c.Upstream.ClusterID, "cluster-id", "CLUSTER_ID", c.Upstream.ClusterID, "ClusterID metadata sent upstream; empty: none (and each XDS_HEADER_<NAME>=<value> in the environment sends <name>: <value>)")
	fs.Duration(&c.Upstream.ConnectTimeout, "connect-timeout", "XDS_CONNECT_TIMEOUT", c.Upstream.ConnectTimeout, "bound on one upstream connection attempt")
	fs.String(&c.SDSSocket, "sds-socket", "SDS_SOCKET", c.SDSSocket, "the pod's sds-edge socket (under -pod-root if relative)")
	fs.Int(&c.MaxMsgSize, "max-msg-size", "XDS_MAX_MSG_SIZE", c.MaxMsgSize, "largest ADS message in bytes, both directions")
	fs.Bool(&c.DNS.Capture, "dns-capture", "ISTIO_META_DNS_CAPTURE", c.DNS.Capture, "serve the pod's DNS proxy from the control plane's name table (Istio's DNS capture)")
	fs.String(&c.DNS.Addr, "dns-addr", "DNS_PROXY_ADDR", c.DNS.Addr, "DNS proxy address, UDP and TCP")
	fs.String(&c.DNS.ResolvConf, "dns-resolv-conf", "DNS_RESOLV_CONF", c.DNS.ResolvConf, "resolv.conf naming the resolvers and search domains of queries the name table does not answer (under -pod-root if relative)")
	fs.Bool(&c.DebugTap.Enabled, "debug-tap", "PROXY_XDS_DEBUG_VIA_AGENT", c.DebugTap.Enabled,
		"serve the debug tap (Istio: PROXY_XDS_DEBUG_VIA_AGENT): istio.io/debug questions on localhost:-debug-tap-port, over gRPC ADS or HTTP GET /debug/<name>, asked of the discovery server on Envoy's ADS stream")
	fs.Int(&c.DebugTap.Port, "debug-tap-port", "PROXY_XDS_DEBUG_VIA_AGENT_PORT", c.DebugTap.Port, "the debug tap's port on localhost (Istio: PROXY_XDS_DEBUG_VIA_AGENT_PORT)")
	fs.String(&c.DNS.Namespace, "pod-namespace", "POD_NAMESPACE", c.DNS.Namespace, "the pod's namespace: with -pod, the pod the relay is on the bus; its services answer to their short names")
	fs.List(&c.Health.IPs, "instance-ip", "INSTANCE_IP", nil, "the workload's IP(s), comma-separated (Istio: INSTANCE_IP): a readinessProbe naming no host probes the first, else localhost")
	fs.String(&c.Health.EnvoyAdmin, "envoy-admin", "ENVOY_ADMIN_ADDR", c.Health.EnvoyAdmin,
		"Envoy's admin address (Istio: ProxyConfig proxyAdminPort, loopback), whose /ready must answer 200 for the workload to be reported healthy; empty: Envoy is not probed")
	c.Wasm.bind(fs)
}

// upstreamDefaults fills what the upstream's security implies when not given: the
// roots of -pilot-cert-provider over TLS, and, over TLS with -xds-auth, the pod's
// service-account token when it exists.
func (c *Config) upstreamDefaults() {
	_, port, _ := net.SplitHostPort(c.Upstream.Address)
	plaintext := c.Upstream.Mode == ModePlaintext || (c.Upstream.Mode == ModeAuto && port == "15010")
	if c.Upstream.RootCA == "" && !plaintext {
		c.Upstream.RootCA = certProviderRoots[c.Upstream.CertProvider]
		// Istio's agent, XDS_ROOT_CA unset, takes the mounted ./etc/certs/root-cert.pem
		// whenever it exists, whatever PILOT_CERT_PROVIDER says (pkg/istio-agent,
		// FindRootCAForXDS: the "old style mounted cert").
		if fileExists(c.Pod.Path(MountedRootCert)) {
			c.Upstream.RootCA = MountedRootCert
		}
	}
	// The pod's token goes upstream by itself only over TLS: a bearer token in
	// plaintext is for whoever is on the path (-token-file still sends it).
	if c.Upstream.Auth && c.Upstream.TokenFile == "" && !plaintext {
		if p := c.Pod.Path(PodTokenFile); fileExists(p) {
			c.Upstream.TokenFile = PodTokenFile
		}
	}
}

// underPodRoot makes the relative paths c names relative to the pod root.
func (c *Config) underPodRoot() {
	c.Socket = c.Pod.Path(c.Socket)
	c.SDSSocket = c.Pod.Path(c.SDSSocket)
	c.DNS.ResolvConf = c.Pod.Path(c.DNS.ResolvConf)
	if c.Wasm.Dir != "" {
		c.Wasm.Dir = c.Pod.Path(c.Wasm.Dir)
	}
	if c.Upstream.TokenFile != "" {
		c.Upstream.TokenFile = c.Pod.Path(c.Upstream.TokenFile)
	}
	if c.Upstream.RootCA != "" && c.Upstream.RootCA != "SYSTEM" {
		c.Upstream.RootCA = c.Pod.Path(c.Upstream.RootCA)
	}
}

// headers are the upstream metadata of the XDS_HEADER_* variables environ names,
// with their values from getenv.
func headers(environ []string, getenv func(string) string) map[string]string {
	out := map[string]string{}
	for _, kv := range environ {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, HeaderEnvPrefix) || len(k) == len(HeaderEnvPrefix) {
			continue
		}
		if v := getenv(k); v != "" {
			out[strings.ToLower(strings.TrimPrefix(k, HeaderEnvPrefix))] = v
		}
	}
	return out
}

// PodRef is the relay's pod as the bus knows it: its namespace (-pod-namespace,
// POD_NAMESPACE; the DNS proxy's too) and name (-pod, POD_NAME).
func (c Config) PodRef() events.PodRef {
	return events.PodRef{Namespace: c.DNS.Namespace, Name: c.Pod.ID}
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	p.Add(c.Log.Validate())
	p.Add(c.Bus.Validate())
	if err := c.PodRef().Validate(); err != nil {
		p.Addf("-pod/-pod-namespace: %w", err)
	}
	if c.Listen.HTTP == "" {
		p.Addf("-http-addr: required")
	}
	if len(c.Socket) > 104 {
		p.Addf("-socket: %q is longer than a unix socket path may be", c.Socket)
	}
	// The relay binds in a private temporary directory next to the socket
	// (dir/.xrNNNNNNNNNN/s, up to 16 bytes more than dir) before linking it into place.
	if d := filepath.Dir(c.Socket); len(d)+16 > 107 {
		p.Addf("-socket: directory %q is too long (max 91 bytes): the socket is first bound in a temporary directory there", d)
	}
	if _, _, err := net.SplitHostPort(c.Upstream.Address); err != nil {
		p.Addf("-discovery-address: %q: want host:port", c.Upstream.Address)
	}
	if _, ok := certProviderRoots[c.Upstream.CertProvider]; !ok {
		p.Addf("-pilot-cert-provider: %q: want istiod, kubernetes or custom", c.Upstream.CertProvider)
	}
	switch c.Upstream.Mode {
	case ModePlaintext, ModeTLS, ModeMTLS:
	default:
		p.Addf("-xds-tls: %q: want auto, plaintext, tls or mtls", c.Upstream.Mode)
	}
	if c.Upstream.Mode == ModePlaintext && c.Upstream.RootCA != "" {
		p.Addf("-xds-root-ca: set but -xds-tls is plaintext")
	}
	if c.MaxMsgSize < 1<<20 {
		p.Addf("-max-msg-size: %d is below 1 MiB", c.MaxMsgSize)
	}
	if c.Upstream.ConnectTimeout <= 0 {
		p.Addf("-connect-timeout: must be positive")
	}
	if c.DNS.Capture {
		if _, _, err := net.SplitHostPort(c.DNS.Addr); err != nil {
			p.Addf("-dns-addr: %q: want host:port", c.DNS.Addr)
		}
		if c.DNS.ResolvConf == "" {
			p.Addf("-dns-resolv-conf: required with -dns-capture")
		}
		if c.DNS.Namespace == "" {
			p.Addf("-pod-namespace: required with -dns-capture")
		}
	}
	c.Wasm.validate(&p)
	if c.DebugTap.Enabled && (c.DebugTap.Port < 1 || c.DebugTap.Port > 65535) {
		p.Addf("-debug-tap-port: %d: want 1-65535 (or -debug-tap=false)", c.DebugTap.Port)
	}
	if c.Health.Probe != nil && c.Health.EnvoyAdmin != "" {
		if _, _, err := net.SplitHostPort(c.Health.EnvoyAdmin); err != nil {
			p.Addf("-envoy-admin: %q: want host:port (or empty: Envoy not probed)", c.Health.EnvoyAdmin)
		}
	}
	for _, ip := range c.Health.IPs {
		if net.ParseIP(ip) == nil {
			p.Addf("-instance-ip: %q is not an IP address", ip)
		}
	}
	keys := make([]string, 0, len(c.Upstream.Headers))
	for k := range c.Upstream.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !validKey(k) {
			p.Addf("%s%s: %q is not a valid gRPC metadata key", HeaderEnvPrefix, strings.ToUpper(k), k)
		}
	}
	return p.Err()
}

func validKey(k string) bool {
	if strings.HasPrefix(k, "grpc-") || strings.HasSuffix(k, "-bin") {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// NeedsSDS reports whether the relay needs sds-edge's material: the workload
// certificate for mtls, or the mesh roots when no root CA file is given.
func (c Config) NeedsSDS() bool {
	return c.Upstream.Mode == ModeMTLS || (c.Upstream.Mode == ModeTLS && c.Upstream.RootCA == "")
}

// DebugTapAddr is where the debug tap listens: localhost, as Istio's agent binds it.
func (c Config) DebugTapAddr() string {
	return net.JoinHostPort("localhost", strconv.Itoa(c.DebugTap.Port))
}

// Process is what the lifecycle reads: the logger (every line names the pod), the
// health and metrics address, and the bus.
func (c Config) Process() lifecycle.Process {
	return lifecycle.Process{Name: "xds-relay", Log: c.Log, LogWith: []any{"pod", c.PodRef().String()}, HTTP: c.Listen.HTTP, Bus: &c.Bus}
}
