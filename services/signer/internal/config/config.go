// Package config reads the signer's configuration: flags, then env vars, then defaults.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/federation"
	"github.com/meshagent/meshagent/services/signer/internal/kubecsr"
	"github.com/meshagent/meshagent/services/signer/internal/rootcm"
)

// Config is the signer's whole configuration.
type Config struct {
	Log obs.LogConfig
	Bus bus.Config
	// BusCallout is the bus's auth callout for pods, served by the signer when
	// IssuerSeed is set.
	BusCallout struct {
		IssuerSeed string // account nkey seed named as the callout issuer in the server's config
		NKeyFile   string // the callout user's nkey seed, to connect with
		// SignByIdentity: answer meshagent.rpc.sign.id.<ns>.<sa>.<pod>, taking the
		// identity from the subject the callout granted instead of verifying the
		// token per request (docs/security.md). Only with IssuerSeed.
		SignByIdentity bool
		// Pods bounds every user the callout mints for a pod (policy.PodLimits).
		Pods policy.PodLimits
		// NodeAgents (<ns>/<sa>) are the node agents whose leaf connections the
		// callout admits, each as the node its token is bound to (the node tier).
		NodeAgents []string
	}
	Instance string // signer instance id, in events and metrics
	Listen   struct {
		HTTP string // /healthz, /readyz, /metrics
		// Pprof serves Go's net/http/pprof profiles there when set (loopback only):
		// off by default, for profiling a signer under load.
		Pprof    string
		GRPC     string // Istio CA API; host:port or unix:///path
		DNSNames []string
		IPs      []net.IP
	}
	TrustDomain string
	CA          struct {
		Dir               string // plugged-in mode when set (Istio cacerts layout)
		ReloadDelay       time.Duration
		KeyAlg            pki.KeyAlg // self-signed root key
		KVBucket          string
		KVReplicas        int
		RootTTL           time.Duration
		CheckInterval     time.Duration
		GracePercent      int
		NewKeyOnRotate    bool
		KEKFile           string        // key-encryption key sealing the self-signed root keys in KV
		RotateMinInterval time.Duration // shortest time between rotations a forced one may follow; 0: no limit
		// ForceRootChange installs a cacerts reload whose CA does not chain to a
		// root trusted now (refused otherwise: the fleet would refuse it).
		ForceRootChange bool
	}
	Certs struct {
		DefaultTTL time.Duration
		MaxTTL     time.Duration
		// PodMaxTTL caps what a pod (a request whose certificate is recorded for
		// a pod) gets, whatever it asks: a longer request is clamped, not refused.
		// 0: DefaultTTL.
		PodMaxTTL time.Duration
		Signers   []string // accepted CertSigner names besides the empty default
		// SignersDir holds each named signer's cacerts directory, <dir>/<name>/;
		// default: -cacerts-dir.
		SignersDir string
		// MaxEarlyPerMinute bounds the early certificates (the one before less than
		// a quarter through its life) one pod is issued per minute (per replica); 0: no bound.
		MaxEarlyPerMinute int
	}
	Auth authn.Config // how bearer tokens are verified
	// Nodes: trusted node agents that may ask for the identity of a workload on
	// their own node (Istio's CA_TRUSTED_NODE_ACCOUNTS and ImpersonatedIdentity),
	// checked against the API server's pods.
	Nodes struct {
		TrustedAccounts []string // <ns>/<sa>
		APIURL          string   // API server; default: in-cluster
		CAFile          string   // its roots; default with TrustedAccounts in a pod: the in-cluster CA
		BearerFile      string   // the signer's token (get/list pods); default likewise
	}
	// RootConfigMap: the trust bundle published into every namespace as a
	// ConfigMap (Istio's istio-ca-root-cert), kept by the rootcm package.
	RootConfigMap struct {
		Name       string // "": not published
		Key        string
		APIURL     string // API server; default: in-cluster
		CAFile     string // its roots; default with Name in a pod: the in-cluster CA
		BearerFile string // the signer's token; default likewise
		Resync     time.Duration
	}
	// RA: the signer as a registration authority (istiod's
	// EXTERNAL_CA=ISTIOD_RA_KUBERNETES_API): it authenticates the caller as
	// always, then has an external signer certify the CSR through the Kubernetes
	// CertificateSigningRequest API (internal/kubecsr). The mesh CA's material
	// still serves the signer's own TLS and endorses the trust bundle, which
	// holds the external signer's roots.
	RA struct {
		ExternalCA string   // "" or ExternalCAKubernetes
		Signer     string   // spec.signerName (K8S_SIGNER)
		RootsFile  string   // the external signer's roots (PEM)
		Usages     []string // spec.usages
		Timeout    time.Duration
		APIURL     string // API server; default: in-cluster
		CAFile     string // its roots; default in a pod: the in-cluster CA
		BearerFile string // the signer's token; default likewise
	}
	Stream struct {
		Replicas int
		MaxAge   time.Duration
	}
	Workers int // concurrent NATS sign requests per replica
	// GCPercent is the process's garbage-collection target (Go's GOGC; -1: off),
	// set by the signer's main: a signer's live heap is a few megabytes, so at Go's
	// default of 100 it collects every hundred or so CSRs.
	GCPercent int
	// Federation: this domain's SPIFFE bundle endpoint and the foreign domains followed.
	Federation struct {
		Listen   string // bundle endpoint listen address; "": not served
		CertFile string // web-PKI serving certificate of the bundle endpoint
		KeyFile  string // its key
		// SPIFFEID: serve the endpoint with an X509-SVID of this ID, issued by our own
		// CA (the https_spiffe profile), instead of CertFile/KeyFile.
		SPIFFEID    string
		RefreshHint time.Duration // spiffe_refresh_hint served
		Endpoints   string        // Istio's SPIFFE_BUNDLE_ENDPOINTS: td|url||td2|url2
		Files       string        // static bundle files: td|path||td2|path2
		CAFile      string        // web-PKI roots for fetching bundle endpoints; "": system roots
		MinRefresh  time.Duration
		MaxRefresh  time.Duration
		// MaxBundleSize bounds a fetched bundle and a bundle file, in bytes.
		MaxBundleSize int
		// Aliases are trust domains pods accept as TrustDomain (their
		// TRUST_DOMAIN_ALIASES): never followed as foreign domains.
		Aliases []string
	}
}

// Process is what the lifecycle reads: the name, the root logger's settings, the
// health and metrics address and the bus.
func (c Config) Process() lifecycle.Process {
	return lifecycle.Process{Name: "signer", Log: c.Log, HTTP: c.Listen.HTTP, Bus: &c.Bus}
}

// Default returns the defaults, named after Istio's where Istio has the knob.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	c.Bus.URL = bus.DefaultURL
	c.Instance, _ = os.Hostname()
	c.Listen.HTTP = "127.0.0.1:15014"
	c.Listen.GRPC = ":15012"
	c.Listen.DNSNames = []string{"istiod.istio-system.svc", "localhost"}
	c.Listen.IPs = []net.IP{net.ParseIP("127.0.0.1")}
	c.TrustDomain = "cluster.local"
	c.CA.ReloadDelay = 500 * time.Millisecond
	c.CA.KeyAlg = pki.ECP256
	c.CA.KVBucket = "meshagent-ca"
	c.CA.KVReplicas = 1
	c.CA.RootTTL = 10 * 365 * 24 * time.Hour
	c.CA.CheckInterval = time.Hour
	c.CA.GracePercent = 20
	c.CA.RotateMinInterval = time.Minute
	c.Certs.DefaultTTL = 24 * time.Hour
	c.Certs.MaxTTL = 90 * 24 * time.Hour
	c.Certs.MaxEarlyPerMinute = 10
	c.Auth = authn.DefaultConfig()
	c.RootConfigMap.Key = rootcm.DefaultKey
	c.RootConfigMap.Resync = 5 * time.Minute
	c.RA.RootsFile = DefaultExternalCACertFile
	c.RA.Usages = kubecsr.DefaultUsages
	c.RA.Timeout = time.Minute
	c.Stream.Replicas = 1
	c.Stream.MaxAge = 7 * 24 * time.Hour
	c.Workers = 64
	c.GCPercent = DefaultGCPercent
	c.Federation.RefreshHint = 5 * time.Minute
	c.Federation.MinRefresh = 10 * time.Second
	c.Federation.MaxRefresh = time.Hour
	c.Federation.MaxBundleSize = federation.DefaultMaxBundleSize
	return c
}

// Load reads flags and env vars over the defaults and validates the result.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Default()
	fs := flagenv.New("signer", getenv)
	var r raw
	bind(fs, &c, &r, getenv)
	errs := r.complete(&c, fs.Parse(args))
	c.Bus.Name = "signer-" + c.Instance
	c.Bus.AsService(policy.Signer)
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// ExternalCAKubernetes is EXTERNAL_CA's one value, as istiod's.
const ExternalCAKubernetes = "ISTIOD_RA_KUBERNETES_API"

// DefaultExternalCACertFile is where istiod's RA reads the external signer's
// root (the external-ca-cert volume, key root-cert.pem).
const DefaultExternalCACertFile = "./etc/external-ca-cert/root-cert.pem"

// DefaultGCPercent is the signer's GC target unless -gogc or GOGC says otherwise:
// four times Go's default, which on make bench's load cut the signer's CPU per CSR
// by about a sixth (docs/benchmarks.md) for a heap of tens of megabytes.
const DefaultGCPercent = 400

// parseGOGC reads a GOGC value: a percent, or off (-1).
func parseGOGC(s string) (int, error) {
	if strings.EqualFold(s, "off") {
		return -1, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a percent or off", s)
	}
	return n, nil
}

// isLoopback reports whether addr is host:port with a loopback host.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
