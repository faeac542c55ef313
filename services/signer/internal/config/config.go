// Package config reads the signer's configuration: flags, then env vars, then defaults.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/authn"
	"github.com/meshagent/meshagent/services/signer/internal/federation"
	"github.com/meshagent/meshagent/services/signer/internal/rootcm"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
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
	Auth struct {
		JWKSFile    string
		JWKSURL     string
		JWKSRefresh time.Duration
		// JWKSMinRefresh is the floor between JWKS re-reads that tokens with an
		// unknown key id trigger.
		JWKSMinRefresh time.Duration
		// Discover: take the JWKS from Issuer's OIDC discovery document (Kubernetes'
		// service-account issuer serves one).
		Discover   bool
		CAFile     string // PEM roots for HTTPS to the issuer and its JWKS; empty: system roots
		BearerFile string // token sent with discovery and JWKS requests
		Issuer     string
		Audience   string
		// TokenReview: ask the API server (authentication.k8s.io/v1 TokenReview)
		// instead of verifying offline, where discovery and the JWKS are not reachable.
		TokenReview      bool
		TokenReviewURL   string        // API server; default: in-cluster (KUBERNETES_SERVICE_HOST/PORT)
		TokenReviewCache time.Duration // longest a verdict is reused (never past the token's exp)
	}
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
	c.Auth.JWKSRefresh = 5 * time.Minute
	c.Auth.JWKSMinRefresh = 10 * time.Second
	c.Auth.Issuer = "meshagent-dev"
	c.Auth.Audience = "istio-ca"
	c.Auth.TokenReviewCache = authn.DefaultReviewCache
	c.RootConfigMap.Key = rootcm.DefaultKey
	c.RootConfigMap.Resync = 5 * time.Minute
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
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	var keyAlg, dnsNames, ips, signers string
	fs.String(&c.BusCallout.IssuerSeed, "bus-callout-seed", "BUS_CALLOUT_SEED", "", "seed file of the bus auth callout's issuer (account nkey); set: admit pods to the bus by their service-account token")
	fs.String(&c.BusCallout.NKeyFile, "bus-callout-nkey", "BUS_CALLOUT_NKEY", "", "seed file of the callout user the responder connects as (with -bus-callout-seed)")
	c.BusCallout.Pods = policy.DefaultPodLimits()
	fs.Duration(&c.BusCallout.Pods.Lifetime, "bus-pod-user-lifetime", "BUS_POD_USER_LIFETIME", c.BusCallout.Pods.Lifetime, "longest life of a pod's bus user, whatever its token's (less up to 10% at random); the pod reconnects and is admitted again with the token its file then holds")
	fs.Int(&c.BusCallout.Pods.MaxAdmissions, "bus-pod-max-connections", "BUS_POD_MAX_CONNECTIONS", c.BusCallout.Pods.MaxAdmissions, "connections the callout admits per pod within -bus-pod-user-lifetime (so: at most this many at once, per signer replica); more are refused (too_many_connections)")
	fs.Int(&c.BusCallout.Pods.MaxPayload, "bus-pod-max-payload", "BUS_POD_MAX_PAYLOAD", c.BusCallout.Pods.MaxPayload, "largest message (bytes) a pod's bus user may send, written into its user JWT")
	fs.Int(&c.BusCallout.Pods.MaxSubs, "bus-pod-max-subs", "BUS_POD_MAX_SUBS", c.BusCallout.Pods.MaxSubs, "most subscriptions a pod's bus user may hold, written into its user JWT")
	fs.Bool(&c.BusCallout.SignByIdentity, "bus-sign-id", "BUS_SIGN_ID", false, "answer sign requests on meshagent.rpc.sign.id.<ns>.<sa>.<pod> taking the identity from the subject (the callout grants it from the token it verified) instead of verifying the token per request; only with -bus-callout-seed, when nothing but callout-admitted pods can publish there")
	fs.String(&c.Instance, "instance", "SIGNER_INSTANCE", c.Instance, "signer instance id (default: hostname)")
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "health and metrics listen address")
	fs.String(&c.Listen.Pprof, "pprof-addr", "SIGNER_PPROF_ADDR", "", "serve Go's profiles (/debug/pprof/) on this loopback address, for profiling under load; empty: not served")
	fs.String(&c.Listen.GRPC, "grpc-addr", "GRPC_ADDR", c.Listen.GRPC, "Istio CA gRPC listen address (host:port or unix:///path)")
	fs.String(&dnsNames, "grpc-dns-names", "GRPC_DNS_NAMES", strings.Join(c.Listen.DNSNames, ","), "DNS SANs of the gRPC serving certificate, comma-separated")
	fs.String(&ips, "grpc-ips", "GRPC_IPS", "127.0.0.1", "IP SANs of the gRPC serving certificate, comma-separated")
	fs.String(&c.TrustDomain, "trust-domain", "TRUST_DOMAIN", c.TrustDomain, "SPIFFE trust domain")
	fs.List(&c.Federation.Aliases, "trust-domain-aliases", "TRUST_DOMAIN_ALIASES", nil, "trust domains the pods accept as this one (Istio's trustDomainAliases), comma-separated: never followed as foreign domains")
	fs.String(&c.CA.Dir, "cacerts-dir", "CACERTS_DIR", "", "plugged-in CA directory (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); empty: self-signed root in KV")
	fs.Duration(&c.CA.ReloadDelay, "cacerts-reload-delay", "CACERTS_RELOAD_DELAY", c.CA.ReloadDelay, "debounce for cacerts directory changes")
	fs.Bool(&c.CA.ForceRootChange, "cacerts-force-root-change", "CACERTS_FORCE_ROOT_CHANGE", false,
		"install a cacerts reload whose CA does not chain to a root trusted now (refused by default: pods would refuse it and expire)")
	fs.String(&keyAlg, "key-alg", "CA_KEY_ALG", string(c.CA.KeyAlg), "self-signed root key algorithm: EC-P256, EC-P384, RSA-2048, RSA-4096")
	fs.String(&c.CA.KVBucket, "kv-bucket", "CA_KV_BUCKET", c.CA.KVBucket, "JetStream KV bucket for the self-signed root")
	fs.Int(&c.CA.KVReplicas, "kv-replicas", "CA_KV_REPLICAS", c.CA.KVReplicas, "replicas of the KV bucket (3 on a cluster)")
	fs.Duration(&c.CA.RootTTL, "root-ttl", "CITADEL_SELF_SIGNED_CA_CERT_TTL", c.CA.RootTTL, "lifetime of a self-signed root")
	fs.Duration(&c.CA.CheckInterval, "root-check-interval", "CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL", c.CA.CheckInterval, "how often to check whether the root needs rotating")
	fs.Int(&c.CA.GracePercent, "root-grace-percent", "CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE", c.CA.GracePercent, "rotate the root when less than this percent of its life is left")
	fs.Bool(&c.CA.NewKeyOnRotate, "root-rotate-new-key", "CA_ROOT_ROTATE_NEW_KEY", false, "give a rotated root a new key (default: keep the key, as Istio)")
	fs.String(&c.CA.KEKFile, "ca-kek-file", "CA_KEK_FILE", "", "file with 32 random bytes (raw or base64; mode 0600, or 0440 with a group of this process) sealing the self-signed root keys in KV; required in self-signed mode")
	fs.Duration(&c.CA.RotateMinInterval, "root-rotate-min-interval", "ROOT_ROTATE_MIN_INTERVAL", c.CA.RotateMinInterval, "refuse a forced root rotation this soon after the last rotation (0: no limit)")
	fs.Duration(&c.Certs.DefaultTTL, "default-ttl", "DEFAULT_WORKLOAD_CERT_TTL", c.Certs.DefaultTTL, "workload certificate lifetime when the request asks for none")
	fs.Duration(&c.Certs.PodMaxTTL, "pod-max-ttl", "POD_MAX_WORKLOAD_CERT_TTL", 0, "longest certificate a pod gets (a request recorded for a pod); longer requests are clamped to it and counted (meshagent_signer_ttl_clamped_total); 0: -default-ttl")
	fs.Int(&c.Certs.MaxEarlyPerMinute, "max-early-certs-per-minute", "MAX_EARLY_CERTS_PER_MINUTE", c.Certs.MaxEarlyPerMinute,
		"most certificates one pod (or SPIFFE ID without a pod) is issued per minute by this replica while the one before is less than a quarter through its life; more are refused saying why (a pod that keeps asking refuses what it gets); 0: no limit")
	fs.Duration(&c.Certs.MaxTTL, "max-ttl", "MAX_WORKLOAD_CERT_TTL", c.Certs.MaxTTL, "longest workload certificate lifetime; longer requests are rejected")
	fs.String(&signers, "cert-signers", "CERT_SIGNERS", "", "CertSigner names accepted besides the default (empty), comma-separated")
	fs.String(&c.Certs.SignersDir, "cert-signers-dir", "CERT_SIGNERS_DIR", "", "directory of the named signers' CA material, <dir>/<signer>/ with Istio's cacerts file names (default: -cacerts-dir)")
	fs.String(&c.Auth.JWKSFile, "jwks-file", "JWKS_FILE", "", "JWKS file to verify bearer tokens")
	fs.String(&c.Auth.JWKSURL, "jwks-url", "JWKS_URL", "", "JWKS URL to verify bearer tokens, re-fetched every -jwks-refresh")
	fs.Duration(&c.Auth.JWKSRefresh, "jwks-refresh", "JWKS_REFRESH", c.Auth.JWKSRefresh, "how often to re-read the JWKS (the key cache's lifetime)")
	fs.Duration(&c.Auth.JWKSMinRefresh, "jwks-min-refresh", "JWKS_MIN_REFRESH", c.Auth.JWKSMinRefresh, "a token with an unknown key id re-reads the JWKS at most this often")
	fs.Bool(&c.Auth.Discover, "token-issuer-discovery", "TOKEN_ISSUER_DISCOVERY", false, "read the JWKS from the jwks_uri of -token-issuer's OIDC discovery document (<issuer>/.well-known/openid-configuration), as Kubernetes serves it")
	fs.Bool(&c.Auth.TokenReview, "token-review", "TOKEN_REVIEW", false, "verify bearer tokens by the API server's TokenReview (needs the ClusterRole system:auth-delegator), where OIDC discovery is not reachable; -token-issuer is then not checked")
	fs.String(&c.Auth.TokenReviewURL, "token-review-url", "TOKEN_REVIEW_URL", authn.InClusterURL(getenv), "API server for -token-review (default in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.Duration(&c.Auth.TokenReviewCache, "token-review-cache", "TOKEN_REVIEW_CACHE", c.Auth.TokenReviewCache, "longest a TokenReview verdict is reused, never past the token's exp (refusals: 10s)")
	fs.String(&c.Auth.CAFile, "token-issuer-ca-file", "TOKEN_ISSUER_CA_FILE", "", "PEM roots for HTTPS to the token issuer and its JWKS, or to the API server with -token-review (in a pod: "+authn.InClusterCAFile+", the default with -token-review); empty: system roots")
	fs.String(&c.Auth.BearerFile, "token-issuer-bearer-file", "TOKEN_ISSUER_BEARER_FILE", "", "token sent as Authorization: Bearer with discovery, JWKS and TokenReview requests, re-read for each (in a pod: "+authn.InClusterTokenFile+", the default with -token-review)")
	fs.String(&c.Auth.Issuer, "token-issuer", "TOKEN_ISSUER", c.Auth.Issuer, "required iss of bearer tokens")
	fs.String(&c.Auth.Audience, "token-audience", "TOKEN_AUDIENCE", c.Auth.Audience, "required aud of bearer tokens")
	fs.Int(&c.Stream.Replicas, "stream-replicas", "EVENTS_REPLICAS", c.Stream.Replicas, "replicas of the event stream, if the signer creates it")
	fs.Duration(&c.Stream.MaxAge, "stream-max-age", "EVENTS_MAX_AGE", c.Stream.MaxAge, "history of the event stream, if the signer creates it")
	fs.Int(&c.Workers, "workers", "SIGNER_WORKERS", c.Workers, "concurrent NATS sign requests")
	gogc := strconv.Itoa(c.GCPercent)
	fs.String(&gogc, "gogc", "GOGC", gogc, "garbage-collection target percent, as Go's GOGC (off: none); the signer's live heap is small, so a higher target costs little memory and saves CPU per CSR")
	fs.String(&c.Federation.Listen, "bundle-endpoint-addr", "BUNDLE_ENDPOINT_ADDR", "", "serve this trust domain's SPIFFE bundle over HTTPS on this address (web PKI, or https_spiffe with -bundle-endpoint-spiffe-id); empty: not served")
	fs.String(&c.Federation.CertFile, "bundle-endpoint-cert", "BUNDLE_ENDPOINT_CERT", "", "web-PKI certificate (PEM chain) of the bundle endpoint")
	fs.String(&c.Federation.KeyFile, "bundle-endpoint-key", "BUNDLE_ENDPOINT_KEY", "", "key of -bundle-endpoint-cert")
	fs.String(&c.Federation.SPIFFEID, "bundle-endpoint-spiffe-id", "BUNDLE_ENDPOINT_SPIFFE_ID", "", "serve the bundle endpoint with an X509-SVID of this SPIFFE ID (of this trust domain) issued by this CA — the https_spiffe profile — instead of -bundle-endpoint-cert/-key")
	fs.Duration(&c.Federation.RefreshHint, "bundle-refresh-hint", "BUNDLE_REFRESH_HINT", c.Federation.RefreshHint, "spiffe_refresh_hint of the served bundle")
	fs.String(&c.Federation.Endpoints, "spiffe-bundle-endpoints", "SPIFFE_BUNDLE_ENDPOINTS", "", "foreign trust domains to follow, as Istio: td|https://url||td2|https://url2 (web PKI); td|https://url|spiffe://td/endpoint-id for an https_spiffe endpoint, whose first bundle comes from -spiffe-bundle-files")
	fs.String(&c.Federation.Files, "spiffe-bundle-files", "SPIFFE_BUNDLE_FILES", "", "foreign trust domains from static SPIFFE bundle files: td|/path||td2|/path2; for a domain with an https_spiffe endpoint, the bundle that authenticates it until the first fetch")
	fs.String(&c.Federation.CAFile, "spiffe-bundle-ca-file", "SPIFFE_BUNDLE_CA_FILE", "", "PEM roots authenticating foreign bundle endpoints (web-PKI); empty: system roots")
	fs.Duration(&c.Federation.MinRefresh, "spiffe-bundle-min-refresh", "SPIFFE_BUNDLE_MIN_REFRESH", c.Federation.MinRefresh, "floor on a foreign bundle's refresh hint, and the retry after a failed fetch")
	fs.Duration(&c.Federation.MaxRefresh, "spiffe-bundle-max-refresh", "SPIFFE_BUNDLE_MAX_REFRESH", c.Federation.MaxRefresh, "ceiling on a foreign bundle's refresh hint")
	fs.Int(&c.Federation.MaxBundleSize, "spiffe-bundle-max-size", "SPIFFE_BUNDLE_MAX_SIZE", c.Federation.MaxBundleSize, "largest foreign bundle taken, in bytes, from an endpoint or a file: a larger one is refused (not cut) and the domain shows the error")
	var trusted string
	fs.String(&trusted, "trusted-node-accounts", "CA_TRUSTED_NODE_ACCOUNTS", "", "node agents (<ns>/<sa>, comma-separated) that may ask for the identity of a workload on their own node (ImpersonatedIdentity); checked by reading pods from the API server")
	fs.String(&c.Nodes.APIURL, "node-api-url", "NODE_API_URL", authn.InClusterURL(getenv), "API server read for -trusted-node-accounts (default in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.String(&c.Nodes.CAFile, "node-api-ca-file", "NODE_API_CA_FILE", "", "PEM roots of -node-api-url (default with -trusted-node-accounts: "+authn.InClusterCAFile+")")
	fs.String(&c.Nodes.BearerFile, "node-api-bearer-file", "NODE_API_BEARER_FILE", "", "the signer's token for -node-api-url, which must allow get and list pods (default with -trusted-node-accounts: "+authn.InClusterTokenFile+")")
	fs.String(&c.RootConfigMap.Name, "root-configmap", "ROOT_CONFIGMAP", "", "publish the trust bundle (every root, newest first) into every namespace as a ConfigMap of this name, as istiod does with istio-ca-root-cert; created in new namespaces, put back when edited or deleted, rewritten when the roots change; empty: not published")
	fs.String(&c.RootConfigMap.Key, "root-configmap-key", "ROOT_CONFIGMAP_KEY", rootcm.DefaultKey, "the key of -root-configmap that holds the bundle")
	fs.String(&c.RootConfigMap.APIURL, "root-configmap-api-url", "ROOT_CONFIGMAP_API_URL", authn.InClusterURL(getenv), "API server for -root-configmap (default in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.String(&c.RootConfigMap.CAFile, "root-configmap-api-ca-file", "ROOT_CONFIGMAP_API_CA_FILE", "", "PEM roots of -root-configmap-api-url (default with -root-configmap: "+authn.InClusterCAFile+")")
	fs.String(&c.RootConfigMap.BearerFile, "root-configmap-api-bearer-file", "ROOT_CONFIGMAP_API_BEARER_FILE", "", "the signer's token for -root-configmap-api-url, which must allow list and watch namespaces, create configmaps, and get, list, watch and patch the ConfigMaps of -root-configmap (default with -root-configmap: "+authn.InClusterTokenFile+")")
	fs.Duration(&c.RootConfigMap.Resync, "root-configmap-resync", "ROOT_CONFIGMAP_RESYNC", c.RootConfigMap.Resync, "how often the namespaces and ConfigMaps are listed again in full (between lists they are watched)")
	perr := fs.Parse(args)
	if accts, err := authn.ParseTrustedAccounts(trusted); err != nil {
		perr = errors.Join(perr, fmt.Errorf("-trusted-node-accounts: %w", err))
	} else {
		c.Nodes.TrustedAccounts = accts
	}
	if len(c.Nodes.TrustedAccounts) > 0 {
		if c.Nodes.CAFile == "" {
			c.Nodes.CAFile = authn.InClusterCAFile
		}
		if c.Nodes.BearerFile == "" {
			c.Nodes.BearerFile = authn.InClusterTokenFile
		}
	}
	if c.RootConfigMap.Name != "" {
		if c.RootConfigMap.CAFile == "" {
			c.RootConfigMap.CAFile = authn.InClusterCAFile
		}
		if c.RootConfigMap.BearerFile == "" {
			c.RootConfigMap.BearerFile = authn.InClusterTokenFile
		}
	}
	c.Listen.DNSNames = flagenv.SplitList(dnsNames)
	if gc, err := parseGOGC(gogc); err != nil {
		perr = errors.Join(perr, fmt.Errorf("-gogc: %w", err))
	} else {
		c.GCPercent = gc
	}
	c.Certs.Signers = flagenv.SplitList(signers)
	if c.Certs.SignersDir == "" {
		c.Certs.SignersDir = c.CA.Dir
	}
	var errs []error
	if perr != nil {
		errs = append(errs, perr)
	}
	c.Listen.IPs = nil
	for _, s := range flagenv.SplitList(ips) {
		ip := net.ParseIP(s)
		if ip == nil {
			errs = append(errs, fmt.Errorf("-grpc-ips: %q is not an IP address", s))
			continue
		}
		c.Listen.IPs = append(c.Listen.IPs, ip)
	}
	alg, err := pki.ParseKeyAlg(keyAlg)
	if err != nil {
		errs = append(errs, fmt.Errorf("-key-alg: %w", err))
	}
	c.CA.KeyAlg = alg
	if c.Auth.TokenReview {
		// In a pod, the service account's own files, as client-go's in-cluster config.
		if c.Auth.CAFile == "" {
			c.Auth.CAFile = authn.InClusterCAFile
		}
		if c.Auth.BearerFile == "" {
			c.Auth.BearerFile = authn.InClusterTokenFile
		}
	}
	c.Bus.Name = "signer-" + c.Instance
	c.Bus.AsService(policy.Signer)
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	p.Add(c.Log.Validate())
	p.Add(c.Bus.Validate())
	p.Check(c.Instance != "", "-instance: required")
	p.Check(c.Listen.HTTP != "", "-http-addr: required")
	p.Check(c.Listen.GRPC != "", "-grpc-addr: required")
	p.Check(c.Listen.Pprof == "" || isLoopback(c.Listen.Pprof), "-pprof-addr: want a loopback host:port (127.0.0.1:6060, [::1]:6060, localhost:6060), got %q: profiles show the signer's code paths and memory layout", c.Listen.Pprof)
	p.Check(len(c.Listen.DNSNames)+len(c.Listen.IPs) > 0, "-grpc-dns-names, -grpc-ips: at least one SAN is required")
	if err := federation.CanonicalTrustDomain(c.TrustDomain); err != nil {
		p.Addf("-trust-domain (TRUST_DOMAIN): %w", err)
	}
	for _, a := range c.Federation.Aliases {
		if err := federation.CanonicalTrustDomain(a); err != nil {
			p.Addf("-trust-domain-aliases (TRUST_DOMAIN_ALIASES): %w", err)
		} else if a == c.TrustDomain {
			p.Addf("-trust-domain-aliases (TRUST_DOMAIN_ALIASES): %q is the trust domain itself", a)
		}
	}
	if c.CA.Dir == "" {
		p.Check(c.CA.KVBucket != "", "-kv-bucket: required in self-signed mode")
		p.Check(c.CA.KVReplicas >= 1, "-kv-replicas: must be at least 1")
		p.Check(c.CA.RootTTL >= time.Minute, "-root-ttl: must be at least 1m")
		p.Check(c.CA.CheckInterval > 0, "-root-check-interval: must be positive")
		p.Check(c.CA.GracePercent > 0 && c.CA.GracePercent < 100, "-root-grace-percent: must be between 1 and 99")
		p.Check(c.CA.KEKFile != "", "-ca-kek-file: required in self-signed mode (32 random bytes sealing the root key in KV; e.g. head -c 32 /dev/urandom > ca-kek; chmod 600 ca-kek)")
		p.Check(c.CA.RotateMinInterval >= 0, "-root-rotate-min-interval: must not be negative")
	} else {
		p.Check(c.CA.ReloadDelay >= 0, "-cacerts-reload-delay: must not be negative")
	}
	p.Check(c.Certs.DefaultTTL > 0, "-default-ttl: must be positive")
	p.Check(c.Certs.PodMaxTTL >= 0 && c.Certs.PodMaxTTL <= c.Certs.MaxTTL, "-pod-max-ttl: must be between 0 (-default-ttl) and -max-ttl (%s)", c.Certs.MaxTTL)
	p.Check(c.Certs.MaxEarlyPerMinute >= 0, "-max-early-certs-per-minute: must not be negative")
	p.Check(c.Certs.MaxTTL >= c.Certs.DefaultTTL, "-max-ttl: must be at least -default-ttl (%s)", c.Certs.DefaultTTL)
	sources := 0
	for _, set := range []bool{c.Auth.JWKSFile != "", c.Auth.JWKSURL != "", c.Auth.Discover, c.Auth.TokenReview} {
		if set {
			sources++
		}
	}
	p.Check(sources <= 1, "-jwks-file, -jwks-url, -token-issuer-discovery, -token-review: set one, not several")
	p.Check(c.Auth.JWKSRefresh > 0, "-jwks-refresh: must be positive")
	p.Check(c.Auth.JWKSMinRefresh >= 0, "-jwks-min-refresh: must not be negative")
	if sources > 0 {
		p.Check(c.Auth.Issuer != "" || c.Auth.TokenReview, "-token-issuer: required with a JWKS")
		p.Check(c.Auth.Audience != "", "-token-audience: required to verify bearer tokens")
	}
	if c.Auth.TokenReview {
		p.Check(strings.HasPrefix(c.Auth.TokenReviewURL, "https://"), "-token-review-url: must be an https URL with -token-review, got %q (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)", c.Auth.TokenReviewURL)
		p.Check(c.Auth.TokenReviewCache >= 0 && c.Auth.TokenReviewCache <= 5*time.Minute, "-token-review-cache: must be between 0 and 5m (a deleted pod's token is honoured that long)")
	}
	if len(c.Nodes.TrustedAccounts) > 0 {
		p.Check(strings.HasPrefix(c.Nodes.APIURL, "https://"), "-node-api-url: must be an https URL with -trusted-node-accounts, got %q (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)", c.Nodes.APIURL)
	}
	if c.Auth.Discover {
		p.Check(strings.HasPrefix(c.Auth.Issuer, "https://"), "-token-issuer: must be an https URL with -token-issuer-discovery, got %q (kubectl get --raw /.well-known/openid-configuration shows the cluster's)", c.Auth.Issuer)
	}
	p.Check(c.Auth.JWKSFile == "" || (c.Auth.CAFile == "" && c.Auth.BearerFile == ""), "-token-issuer-ca-file, -token-issuer-bearer-file: only with -jwks-url, -token-issuer-discovery or -token-review")
	if c.BusCallout.IssuerSeed != "" {
		p.Check(c.BusCallout.NKeyFile != "", "-bus-callout-nkey: required with -bus-callout-seed")
		if err := c.BusCallout.Pods.Validate(); err != nil {
			p.Add(fmt.Errorf("-bus-pod-*: %w", err))
		}
		p.Check(sources > 0, "-bus-callout-seed: needs -jwks-file, -jwks-url, -token-issuer-discovery or -token-review to verify pods' tokens")
	} else {
		p.Check(c.BusCallout.NKeyFile == "", "-bus-callout-nkey: set only with -bus-callout-seed")
		p.Check(!c.BusCallout.SignByIdentity, "-bus-sign-id: only with -bus-callout-seed (without this signer's callout, the subject proves nothing)")
	}
	if c.RootConfigMap.Name != "" {
		p.Check(dnsSubdomain.MatchString(c.RootConfigMap.Name) && len(c.RootConfigMap.Name) <= 253, "-root-configmap: %q is not a ConfigMap name (lowercase letters, digits, '-' and '.', at most 253)", c.RootConfigMap.Name)
		p.Check(configMapKey.MatchString(c.RootConfigMap.Key) && len(c.RootConfigMap.Key) <= 253, "-root-configmap-key: %q is not a ConfigMap key (letters, digits, '-', '_' and '.', at most 253)", c.RootConfigMap.Key)
		p.Check(strings.HasPrefix(c.RootConfigMap.APIURL, "https://"), "-root-configmap-api-url: must be an https URL with -root-configmap, got %q (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)", c.RootConfigMap.APIURL)
		p.Check(c.RootConfigMap.Resync >= 10*time.Second, "-root-configmap-resync: must be at least 10s")
	}
	p.Check(c.Stream.Replicas >= 1, "-stream-replicas: must be at least 1")
	p.Check(c.Stream.MaxAge > 0, "-stream-max-age: must be positive")
	p.Check(c.Workers >= 1, "-workers: must be at least 1")
	p.Check(c.GCPercent == -1 || c.GCPercent >= 1, "-gogc: must be a positive percent or off")
	if c.Federation.Listen != "" {
		if c.Federation.SPIFFEID != "" {
			p.Check(c.Federation.CertFile == "" && c.Federation.KeyFile == "", "-bundle-endpoint-spiffe-id: not with -bundle-endpoint-cert/-key (one serving certificate)")
			if id, err := spiffeid.FromString(c.Federation.SPIFFEID); err != nil {
				p.Addf("-bundle-endpoint-spiffe-id: %w", err)
			} else {
				p.Check(id.TrustDomain().Name() == c.TrustDomain, "-bundle-endpoint-spiffe-id: %s is not in this trust domain %q (our CA issues it)", id, c.TrustDomain)
			}
		} else {
			p.Check(c.Federation.CertFile != "" && c.Federation.KeyFile != "", "-bundle-endpoint-cert, -bundle-endpoint-key (or -bundle-endpoint-spiffe-id): required with -bundle-endpoint-addr")
		}
		p.Check(c.Federation.RefreshHint >= time.Second, "-bundle-refresh-hint: must be at least 1s")
	} else {
		p.Check(c.Federation.SPIFFEID == "", "-bundle-endpoint-spiffe-id: only with -bundle-endpoint-addr")
	}
	p.Add(c.ValidateFederation())
	p.Check(c.Federation.MinRefresh > 0 && c.Federation.MinRefresh <= c.Federation.MaxRefresh, "-spiffe-bundle-min-refresh: must be positive and at most -spiffe-bundle-max-refresh")
	p.Check(c.Federation.MaxBundleSize >= 1<<10 && c.Federation.MaxBundleSize <= 64<<20, "-spiffe-bundle-max-size (SPIFFE_BUNDLE_MAX_SIZE): want 1024 to %d bytes, got %d", 64<<20, c.Federation.MaxBundleSize)
	return p.Err()
}

// ValidateFederation checks the foreign trust domains to follow: each entry well formed, each trust domain in its canonical form (see
// federation.ParseTrustDomain), and none of them this trust domain or one of
// its aliases. Errors name the flag and its environment variable.
func (c Config) ValidateFederation() error {
	_, err := c.FederationSources()
	return err
}

// FederationSources are the foreign trust domains to follow (ValidateFederation).
func (c Config) FederationSources() ([]federation.Source, error) {
	var p flagenv.Problems
	eps, err := federation.ParseEndpoints(c.Federation.Endpoints)
	if err != nil {
		p.Addf("-spiffe-bundle-endpoints (SPIFFE_BUNDLE_ENDPOINTS): %w", err)
	}
	files, ferr := federation.ParseFiles(c.Federation.Files)
	if ferr != nil {
		p.Addf("-spiffe-bundle-files (SPIFFE_BUNDLE_FILES): %w", ferr)
	}
	own := func(flag string, srcs []federation.Source) {
		for _, s := range srcs {
			switch name := s.TrustDomain.Name(); {
			case name == c.TrustDomain:
				p.Addf("%s: %q is this signer's own trust domain (-trust-domain), not a foreign one", flag, name)
			case slices.Contains(c.Federation.Aliases, name):
				p.Addf("%s: %q is an alias of this trust domain (-trust-domain-aliases), not a foreign one", flag, name)
			}
		}
	}
	own("-spiffe-bundle-endpoints (SPIFFE_BUNDLE_ENDPOINTS)", eps)
	own("-spiffe-bundle-files (SPIFFE_BUNDLE_FILES)", files)
	var srcs []federation.Source
	if err == nil && ferr == nil {
		if srcs, err = federation.WithBootstraps(eps, files); err != nil {
			p.Addf("-spiffe-bundle-endpoints, -spiffe-bundle-files (SPIFFE_BUNDLE_ENDPOINTS, SPIFFE_BUNDLE_FILES): %w", err)
		}
	}
	if err := p.Err(); err != nil {
		return nil, err
	}
	return srcs, nil
}

var (
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	configMapKey = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)
)

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
