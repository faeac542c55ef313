// Package config reads sds-edge's configuration: flags, then env vars, then defaults.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/sds-edge/internal/clientcert"
)

// Config is sds-edge's whole configuration.
type Config struct {
	Log    obs.LogConfig
	Bus    bus.Config
	Listen struct {
		HTTP string // /healthz, /readyz, /metrics
	}
	Pod struct {
		pod.Config  // id and root (relative paths below are under it), as every pod-side process reads them
		TrustDomain string
		// TrustDomainAliases are accepted as TrustDomain (TRUST_DOMAIN_ALIASES).
		TrustDomainAliases []string
		Namespace          string
		ServiceAccount     string
	}
	CA struct {
		Addr string // Istio gRPC CA (host:port); empty: the signer over NATS
		// FallbackAddrs are the CAs' gRPC APIs (Istio's, host:port; every signer's,
		// or a service name that reaches them all), tried in turn when the bus is
		// unreachable or no signer answers on it in time; signing is on the bus
		// otherwise.
		FallbackAddrs []string
		RootCert      string // PEM roots to verify Addr's TLS, with the pod's bundle; the trust anchors when TrustAnchorsFile is unset
		// SystemRoots: the host's trust store verifies Addr's TLS, and nothing else
		// does (Istio's CA_ROOT_CA=SYSTEM, for a CA with a publicly signed certificate).
		SystemRoots bool
		ClusterID   string
		TokenFile   string
		// Plaintext: no TLS to Addr, as Istio does for port 15010.
		Plaintext bool
		// ViaNode is the node whose tier (its node agent, a NATS leaf node) the pod
		// reaches the bus through: sign requests go on that node's sign subject,
		// with the pod's token (docs/scale.md, "The node tier"). Empty: the pod is
		// on the hub itself.
		ViaNode string
		// TrustAnchorsFile holds the PEM roots the pod trusts before it has talked
		// to anyone: the first trust bundle must be endorsed by one of them. Empty:
		// trust on first use.
		TrustAnchorsFile string
		// TrustState is where the pod keeps the CA roots it trusts (0600, under the
		// pod root), read back at start as trust anchors: a restarted pod trusts
		// what it trusted before, not the first bundle it hears.
		TrustState string
		// ProvCert is Istio's PROV_CERT: a directory with cert-chain.pem and key.pem
		// of a provisioned certificate (a VM's; its own OUTPUT_CERTS from before a
		// restart), used when there is neither a token nor a still-valid certificate
		// of our own: presented to the bus (whose auth callout admits the pod by it)
		// and over mTLS to the gRPC CA, and proven in a bus sign request.
		ProvCert string
	}
	Cert struct {
		TTL    time.Duration
		KeyAlg pki.KeyAlg
		// Signer is the named signer asked for (Istio's ISTIO_META_CERT_SIGNER);
		// empty: the CA's default.
		Signer         string
		PKCS8          bool
		SafetyRatio    float64       // renew by ourselves at this fraction of the lifetime
		GraceRatio     float64       // the rotator's renew-due: this fraction of the lifetime left
		RetryMin       time.Duration // first retry delay after a failed CSR
		RetryMax       time.Duration
		RequestTimeout time.Duration
		OutputDir      string // OUTPUT_CERTS
		// State is where the pod keeps its current key and chain (0600, beside
		// the trust state), served again at once after a restart; "" with
		// -keep-cert=false (the key then stays in memory only).
		State          string
		FileMounted    bool   // FILE_MOUNTED_CERTS: read etc/certs
		CredentialsDir string // workload-spiffe-credentials
		FileMountedDir string // etc/certs
		// FileCertDirs are the directories file-cert:/file-root: resources may be
		// read from (FILE_CERT_DIRS), absolute once loaded.
		FileCertDirs []string
		FileDebounce time.Duration
	}
	SDS struct {
		Socket       string
		SocketMode   os.FileMode
		ExternalWait time.Duration // wait this long for another provider's socket
	}
	// ClientCert is the certificate the pod presents as a TLS client (to the bus and
	// to the gRPC CA). Not a flag: Load makes it, so that the bus connection (made
	// before sdsedge.New) and the CA flow (made in Run) share it.
	ClientCert *clientcert.Source
	// Gateway is the gateway credential server (router mode): `kubernetes://NAME`
	// resources from secret directories, on a socket of their own.
	Gateway struct {
		Dir    string // one directory per secret; empty: no gateway credential server
		Socket string
	}
}

// Default returns the defaults, laid out as Istio lays out a pod.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	// 15023: Istio uses none of 15020-15022 for this; 15020 is the launcher's
	// status port (Istio's), 15021 the launcher's own HTTP, 15022 the relay's.
	c.Listen.HTTP = "127.0.0.1:15023"
	c.Pod.RootDir = pod.DefaultRoot
	c.Pod.TrustDomain = "cluster.local"
	c.Pod.Namespace = "default"
	c.Pod.ServiceAccount = "default"
	c.CA.TokenFile = "var/run/secrets/tokens/istio-token"
	c.CA.ClusterID = "Kubernetes"
	c.Cert.TTL = 24 * time.Hour
	c.Cert.KeyAlg = pki.ECP256
	c.Cert.SafetyRatio = 0.8
	c.Cert.GraceRatio = 0.5
	c.Cert.RetryMin = 100 * time.Millisecond
	c.Cert.RetryMax = 30 * time.Second
	// Short: an attempt that reached a frozen signer replica costs this much, and
	// the next one (a second or less later) can reach another. A signer signs in
	// milliseconds, and drops a request whose requester has stopped waiting.
	c.Cert.RequestTimeout = 4 * time.Second
	c.Cert.CredentialsDir = "var/run/secrets/workload-spiffe-credentials"
	c.Cert.FileMountedDir = "etc/certs"
	c.Cert.FileCertDirs = DefaultFileCertDirs
	c.Cert.FileDebounce = 100 * time.Millisecond
	c.SDS.Socket = "var/run/secrets/workload-spiffe-uds/socket"
	c.SDS.SocketMode = 0o600
	c.Gateway.Socket = "var/run/secrets/workload-spiffe-uds/credential-socket"
	return c
}

// Load reads flags and env vars over the defaults, resolves paths under the pod root
// and validates the result.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Default()
	// PROXY_CONFIG's proxyMetadata are env vars under the container's own (as
	// Istio's agent applies them); sds-edge acts on no other ProxyConfig field.
	_, getenv, pcErr := istioenv.Load(getenv)
	fs := flagenv.New("sds-edge", getenv)
	raw := rawFlags{keep: true}
	c.bind(fs, &raw)
	if err := fs.Parse(args); err != nil {
		return c, errors.Join(pcErr, err)
	}
	errs := append([]error{pcErr}, c.resolve(raw)...)
	c.Bus.Name = "sds-edge/" + c.PodRef().String()
	c.CA.TokenFile = c.Pod.Path(c.CA.TokenFile)
	c.Bus.AsPod(c.PodRef(), c.CA.TokenFile)
	c.Bus.NodeLocal = c.CA.ViaNode != ""
	errs = append(errs, c.underPodRoot(raw.keep)...)
	// The pod presents its certificate to a bus that asks for one (a TLS bus whose
	// callout admits a VM by it); a plaintext bus is still reached in plaintext.
	c.ClientCert = clientcert.New(c.CA.ProvCert)
	if c.Bus.TLS.CertFile == "" {
		c.Bus.TLS.ClientCert = c.ClientCert.Get
	}
	c.CA.Plaintext = strings.HasSuffix(c.CA.Addr, ":15010")
	// With a CA reachable without the bus, serving must not wait for the bus.
	c.Bus.Background = c.CA.Addr != "" || len(c.CA.FallbackAddrs) > 0
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return c, err
	}
	return c, nil
}

// resolve turns the flags read as text into c: the key algorithm, the gRPC CA's
// default roots and the socket mode. It returns what does not parse.
func (c *Config) resolve(raw rawFlags) []error {
	var errs []error
	if a, err := keyAlgorithm(raw.keyAlg, raw.eccAlg, raw.eccCurve); err != nil {
		errs = append(errs, err)
	} else {
		c.Cert.KeyAlg = a
	}
	// Istio's agent takes CA_ROOT_CA first (SYSTEM or a file), then
	// PILOT_CERT_PROVIDER's roots (pkg/istio-agent, FindRootCAForCA).
	switch {
	case raw.caRootCA != "" && c.CA.RootCert != "":
		errs = append(errs, errors.New("-ca-root-ca and -ca-root-cert both given: set one"))
	case raw.caRootCA == SystemRoots:
		c.CA.SystemRoots = true
	case raw.caRootCA != "":
		c.CA.RootCert = raw.caRootCA
	}
	if p, ok := certProviderRoots[raw.certProvider]; !ok {
		errs = append(errs, fmt.Errorf("-pilot-cert-provider: %q: want istiod, kubernetes or custom", raw.certProvider))
	} else if c.CA.RootCert == "" && !c.CA.SystemRoots && (c.CA.Addr != "" || len(c.CA.FallbackAddrs) > 0) {
		c.CA.RootCert = p // only a gRPC CA is verified by these roots
	}
	if m, err := strconv.ParseUint(raw.socketMode, 8, 32); err != nil {
		errs = append(errs, fmt.Errorf("-socket-mode: %q is not an octal mode", raw.socketMode))
	} else {
		c.SDS.SocketMode = os.FileMode(m)
	}
	return errs
}

// underPodRoot makes the relative paths c names relative to the pod root, and
// sets the paths kept under it (the trust state, and the certificate's if keep).
// It returns the -file-cert-dirs that cannot be made absolute.
func (c *Config) underPodRoot(keep bool) []error {
	if c.CA.RootCert != "" {
		c.CA.RootCert = c.Pod.Path(c.CA.RootCert)
	}
	if c.CA.ProvCert != "" {
		c.CA.ProvCert = c.Pod.Path(c.CA.ProvCert)
	}
	if c.CA.TrustAnchorsFile != "" {
		c.CA.TrustAnchorsFile = c.Pod.Path(c.CA.TrustAnchorsFile)
	} else if p := c.Pod.Path(DefaultTrustAnchors); fileExists(p) {
		c.CA.TrustAnchorsFile = p
	}
	c.CA.TrustState = c.Pod.Path(DefaultTrustState)
	if keep {
		c.Cert.State = c.Pod.Path(DefaultCertState)
	}
	if c.Cert.OutputDir != "" {
		c.Cert.OutputDir = c.Pod.Path(c.Cert.OutputDir)
	}
	c.Cert.CredentialsDir = c.Pod.Path(c.Cert.CredentialsDir)
	c.Cert.FileMountedDir = c.Pod.Path(c.Cert.FileMountedDir)
	var errs []error
	dirs := c.Cert.FileCertDirs
	c.Cert.FileCertDirs = nil
	for _, d := range dirs {
		abs, err := filepath.Abs(c.Pod.Path(d))
		if err != nil {
			errs = append(errs, fmt.Errorf("-file-cert-dirs: %s: %w", d, err))
			continue
		}
		c.Cert.FileCertDirs = append(c.Cert.FileCertDirs, abs)
	}
	c.SDS.Socket = c.Pod.Path(c.SDS.Socket)
	c.Gateway.Socket = c.Pod.Path(c.Gateway.Socket)
	if c.Gateway.Dir != "" {
		c.Gateway.Dir = c.Pod.Path(c.Gateway.Dir)
	}
	return errs
}

// SystemRoots as -ca-root-ca is the host's trust store, as Istio's CA_ROOT_CA=SYSTEM.
const SystemRoots = "SYSTEM"

// certProviderRoots is the default -ca-root-cert of each PILOT_CERT_PROVIDER,
// as Istio's agent picks the CA's roots (empty: the pod's trust bundle).
var certProviderRoots = map[string]string{
	"istiod":     "",
	"kubernetes": "var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
	"custom":     "etc/certs/root-cert.pem",
}

// keyAlgorithm is the workload key's algorithm: -key-alg when given, else Istio's
// ECC_SIGNATURE_ALGORITHM=ECDSA with ECC_CURVE, else EC-P256. Istio's default,
// with neither set, is RSA-2048: meshagent keeps EC (docs/istio.md).
func keyAlgorithm(keyAlg, eccAlg, eccCurve string) (pki.KeyAlg, error) {
	var ecc pki.KeyAlg
	switch strings.ToUpper(eccAlg) {
	case "":
	case "ECDSA":
		switch strings.ToUpper(eccCurve) {
		case "P256", "":
			ecc = pki.ECP256
		case "P384":
			ecc = pki.ECP384
		default:
			return "", fmt.Errorf("-ecc-curve: %q: want P256 or P384", eccCurve)
		}
	default:
		return "", fmt.Errorf("-ecc-signature-algorithm: %q: want ECDSA (or unset)", eccAlg)
	}
	if keyAlg == "" {
		if ecc == "" {
			return pki.ECP256, nil
		}
		return ecc, nil
	}
	a, err := pki.ParseKeyAlg(keyAlg)
	if err != nil {
		return "", fmt.Errorf("-key-alg: %w", err)
	}
	if ecc != "" && a != ecc {
		return "", fmt.Errorf("-key-alg %s and -ecc-signature-algorithm %s -ecc-curve %s disagree: set one", a, eccAlg, eccCurve)
	}
	return a, nil
}

// Process is what the lifecycle reads from the config (pkg/lifecycle): sds-edge
// logs with its pod on every line and always has a bus connection, which, when a
// CA is configured that answers without the bus (-ca-addr, -ca-fallback-addr), is
// made in the background (bus.Config.Background) so that start never waits for it.
func (c Config) Process() lifecycle.Process {
	return lifecycle.Process{Name: "sds-edge", Log: c.Log, LogWith: []any{"pod", c.PodRef().String()}, HTTP: c.Listen.HTTP, Bus: &c.Bus}
}

// DefaultFileCertDirs are where Istio's file-mounted certificates live in a pod
// (under the pod root): /etc/certs (FILE_MOUNTED_CERTS, DestinationRule client
// certificates), /etc/istio (gateways' mounted certificates, the proxy's own
// config) and /var/run/secrets (the mesh root, workload credentials). file-cert:
// and file-root: may read nothing else unless -file-cert-dirs says so.
var DefaultFileCertDirs = []string{"etc/certs", "etc/istio", "var/run/secrets"}

// DefaultTrustAnchors is where Istio mounts the mesh root in a pod, under the pod
// root; used as -trust-anchors-file when it exists.
const DefaultTrustAnchors = "var/run/secrets/istio/root-cert.pem"

// DefaultTrustState is where, under the pod root, sds-edge keeps the CA roots it
// trusts across restarts.
const DefaultTrustState = "var/lib/meshagent/trusted-roots.pem"

// DefaultCertState is where, under the pod root, sds-edge keeps its current key and
// certificate chain (0600), to serve them at once after a restart.
const DefaultCertState = "var/lib/meshagent/default-key-and-chain.pem"

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// PodRef is the pod this sds-edge serves, as the bus knows it: its namespace
// (-namespace, POD_NAMESPACE) and name (-pod, POD_NAME).
func (c Config) PodRef() events.PodRef {
	return events.PodRef{Namespace: c.Pod.Namespace, Name: c.Pod.ID}
}

// SPIFFEID is the identity this pod asks for.
func (c Config) SPIFFEID() (string, error) {
	id, err := pki.WorkloadID(c.Pod.TrustDomain, c.Pod.Namespace, c.Pod.ServiceAccount)
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	p.Add(c.Log.Validate())
	p.Add(c.Bus.Validate())
	if c.CA.ViaNode != "" {
		if err := events.ValidateNodeName(c.CA.ViaNode); err != nil {
			p.Addf("-bus-via-node: %w", err)
		}
	}
	if c.Pod.ID == "" {
		p.Addf("-pod: required")
	} else if err := c.PodRef().Validate(); err != nil {
		p.Addf("-pod/-namespace: %w", err)
	}
	if _, err := c.SPIFFEID(); err != nil {
		p.Addf("-trust-domain/-namespace/-service-account: %w", err)
	}
	p.Check(c.Listen.HTTP != "", "-http-addr: required")
	p.Check(c.Cert.TTL >= time.Second, "-secret-ttl: must be at least 1s (a CA counts the TTL in whole seconds), got %s", c.Cert.TTL)
	p.Check(c.Cert.SafetyRatio > 0 && c.Cert.SafetyRatio < 1, "-safety-ratio: must be between 0 and 1, got %v", c.Cert.SafetyRatio)
	p.Check(c.Cert.GraceRatio > 0 && c.Cert.GraceRatio < 1, "-grace-ratio: must be between 0 and 1, got %v", c.Cert.GraceRatio)
	p.Check(c.Cert.RetryMin > 0, "-retry-min: must be positive")
	p.Check(c.Cert.RetryMax >= c.Cert.RetryMin, "-retry-max: must be at least -retry-min")
	p.Check(c.Cert.RequestTimeout > 0, "-ca-timeout: must be positive")
	p.Check(c.Cert.FileDebounce >= 0, "-file-debounce: must not be negative")
	p.Check(c.SDS.Socket != "", "-socket: required")
	p.Check(len(c.SDS.Socket) < 108, "-socket: path %q is longer than a unix socket allows (107 bytes)", c.SDS.Socket)
	p.Check(c.SDS.SocketMode == 0o600 || c.SDS.SocketMode == 0o660, "-socket-mode: must be 0600 or 0660, got %#o", c.SDS.SocketMode)
	if c.Gateway.Dir != "" {
		p.Check(len(c.Gateway.Socket) < 108, "-credential-socket: path %q is longer than a unix socket allows (107 bytes)", c.Gateway.Socket)
		p.Check(c.Gateway.Socket != c.SDS.Socket, "-credential-socket: must not be the workload's -socket %q", c.SDS.Socket)
	}
	p.Check(c.SDS.ExternalWait >= 0, "-external-wait: must not be negative")
	p.Check(c.CA.TokenFile != "", "-token-file: required")
	p.Check(c.CA.Addr == "" || len(c.CA.FallbackAddrs) == 0, "-ca-fallback-addr: not with -ca-addr, which signs over gRPC always")
	return p.Err()
}
