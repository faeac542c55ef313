package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/rootcm"
)

// raw holds the flags read as text, made into Config fields once parsed
// (complete).
type raw struct{ keyAlg, dnsNames, ips, signers, gogc, trusted, usages string }

// bind declares every flag of the signer on fs, over c's defaults.
func bind(fs *flagenv.Set, c *Config, r *raw, getenv func(string) string) {
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	bindBusCallout(fs, c)
	bindListen(fs, c, r)
	bindCA(fs, c, r)
	bindCerts(fs, c, r)
	bindAuth(fs, c, getenv)
	bindRuntime(fs, c, r)
	bindFederation(fs, c)
	bindNodes(fs, c, r, getenv)
	bindRootConfigMap(fs, c, getenv)
	bindRA(fs, c, r, getenv)
}

// bindRA declares the registration-authority mode: an external signer through
// the Kubernetes CertificateSigningRequest API, with istiod's env names.
func bindRA(fs *flagenv.Set, c *Config, r *raw, getenv func(string) string) {
	fs.String(&c.RA.ExternalCA, "external-ca", "EXTERNAL_CA", "", "set to "+ExternalCAKubernetes+" to be a registration authority, as istiod: authenticate the caller, then have the -k8s-signer certify its CSR through the Kubernetes CertificateSigningRequest API (create, approve, wait, delete); empty: this CA signs")
	fs.String(&c.RA.Signer, "k8s-signer", "K8S_SIGNER", "", "spec.signerName of the CSRs (with -external-ca), such as kubernetes.io/kube-apiserver-client for kube-controller-manager's signer")
	fs.String(&c.RA.RootsFile, "external-ca-cert-file", "EXTERNAL_CA_CERT_FILE", c.RA.RootsFile, "PEM roots of the -k8s-signer (with -external-ca): its certificates must verify to them, and they join the trust bundle the pods get, endorsed by this CA (istiod's external-ca-cert volume)")
	r.usages = strings.Join(c.RA.Usages, ",")
	fs.String(&r.usages, "k8s-signer-usages", "K8S_SIGNER_USAGES", r.usages, "spec.usages of the CSRs, comma-separated (istiod's; kube-controller-manager's kubernetes.io/kube-apiserver-client signs only with 'digital signature,key encipherment,client auth')")
	fs.Duration(&c.RA.Timeout, "k8s-csr-timeout", "K8S_CSR_TIMEOUT", c.RA.Timeout, "longest wait for the -k8s-signer to sign an approved CSR (istiod: 60s); the request's own deadline may end it sooner")
	fs.String(&c.RA.APIURL, "k8s-csr-api-url", "K8S_CSR_API_URL", authn.InClusterURL(getenv), "API server of the CSRs (default in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.String(&c.RA.CAFile, "k8s-csr-api-ca-file", "K8S_CSR_API_CA_FILE", "", "PEM roots of -k8s-csr-api-url (default with -external-ca: "+authn.InClusterCAFile+")")
	fs.String(&c.RA.BearerFile, "k8s-csr-api-bearer-file", "K8S_CSR_API_BEARER_FILE", "", "the signer's token for -k8s-csr-api-url, which must allow create, get, watch and delete certificatesigningrequests, update certificatesigningrequests/approval and approve signers/<-k8s-signer> (default with -external-ca: "+authn.InClusterTokenFile+")")
}

// bindBusCallout declares the bus auth callout's flags.
func bindBusCallout(fs *flagenv.Set, c *Config) {
	fs.String(&c.BusCallout.IssuerSeed, "bus-callout-seed", "BUS_CALLOUT_SEED", "", "seed file of the bus auth callout's issuer (account nkey); set: admit pods to the bus by their service-account token")
	fs.String(&c.BusCallout.NKeyFile, "bus-callout-nkey", "BUS_CALLOUT_NKEY", "", "seed file of the callout user the responder connects as (with -bus-callout-seed)")
	c.BusCallout.Pods = policy.DefaultPodLimits()
	fs.Duration(&c.BusCallout.Pods.Lifetime, "bus-pod-user-lifetime", "BUS_POD_USER_LIFETIME", c.BusCallout.Pods.Lifetime, "longest life of a pod's bus user, whatever its token's (less up to 10% at random); the pod reconnects and is admitted again with the token its file then holds")
	fs.Int(&c.BusCallout.Pods.MaxAdmissions, "bus-pod-max-connections", "BUS_POD_MAX_CONNECTIONS", c.BusCallout.Pods.MaxAdmissions, "connections the callout admits per pod within -bus-pod-user-lifetime (so: at most this many at once, per signer replica); more are refused (too_many_connections)")
	fs.Int(&c.BusCallout.Pods.MaxPayload, "bus-pod-max-payload", "BUS_POD_MAX_PAYLOAD", c.BusCallout.Pods.MaxPayload, "largest message (bytes) a pod's bus user may send, written into its user JWT")
	fs.Int(&c.BusCallout.Pods.MaxSubs, "bus-pod-max-subs", "BUS_POD_MAX_SUBS", c.BusCallout.Pods.MaxSubs, "most subscriptions a pod's bus user may hold, written into its user JWT")
	fs.List(&c.BusCallout.NodeAgents, "node-agent-accounts", "NODE_AGENT_ACCOUNTS", nil, "node agents (<ns>/<sa>, comma-separated) whose NATS leaf connections the bus callout admits, each as the node its token is bound to (the node tier, docs/scale.md); their pods' sign requests come on meshagent.rpc.sign.node.<node>.<ns>.<pod>")
	fs.Bool(&c.BusCallout.SignByIdentity, "bus-sign-id", "BUS_SIGN_ID", false, "answer sign requests on meshagent.rpc.sign.id.<ns>.<sa>.<pod> taking the identity from the subject (the callout grants it from the token it verified) instead of verifying the token per request; only with -bus-callout-seed, when nothing but callout-admitted pods can publish there")
}

// bindListen declares the instance and what the signer listens on.
func bindListen(fs *flagenv.Set, c *Config, r *raw) {
	fs.String(&c.Instance, "instance", "SIGNER_INSTANCE", c.Instance, "signer instance id (default: hostname)")
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "health and metrics listen address")
	fs.String(&c.Listen.Pprof, "pprof-addr", "SIGNER_PPROF_ADDR", "", "serve Go's profiles (/debug/pprof/) on this loopback address, for profiling under load; empty: not served")
	fs.String(&c.Listen.GRPC, "grpc-addr", "GRPC_ADDR", c.Listen.GRPC, "Istio CA gRPC listen address (host:port or unix:///path)")
	fs.String(&r.dnsNames, "grpc-dns-names", "GRPC_DNS_NAMES", strings.Join(c.Listen.DNSNames, ","), "DNS SANs of the gRPC serving certificate, comma-separated")
	fs.String(&r.ips, "grpc-ips", "GRPC_IPS", "127.0.0.1", "IP SANs of the gRPC serving certificate, comma-separated")
	fs.String(&c.TrustDomain, "trust-domain", "TRUST_DOMAIN", c.TrustDomain, "SPIFFE trust domain")
	fs.List(&c.Federation.Aliases, "trust-domain-aliases", "TRUST_DOMAIN_ALIASES", nil, "trust domains the pods accept as this one (Istio's trustDomainAliases), comma-separated: never followed as foreign domains")
}

// bindCA declares where the CA material comes from and how the self-signed root is kept.
func bindCA(fs *flagenv.Set, c *Config, r *raw) {
	fs.String(&c.CA.Dir, "cacerts-dir", "CACERTS_DIR", "", "plugged-in CA directory (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); empty: self-signed root in KV")
	fs.Duration(&c.CA.ReloadDelay, "cacerts-reload-delay", "CACERTS_RELOAD_DELAY", c.CA.ReloadDelay, "debounce for cacerts directory changes")
	fs.Bool(&c.CA.ForceRootChange, "cacerts-force-root-change", "CACERTS_FORCE_ROOT_CHANGE", false,
		"install a cacerts reload whose CA does not chain to a root trusted now (refused by default: pods would refuse it and expire)")
	fs.String(&r.keyAlg, "key-alg", "CA_KEY_ALG", string(c.CA.KeyAlg), "self-signed root key algorithm: EC-P256, EC-P384, RSA-2048, RSA-4096")
	fs.String(&c.CA.KVBucket, "kv-bucket", "CA_KV_BUCKET", c.CA.KVBucket, "JetStream KV bucket for the self-signed root")
	fs.Int(&c.CA.KVReplicas, "kv-replicas", "CA_KV_REPLICAS", c.CA.KVReplicas, "replicas of the KV bucket (3 on a cluster)")
	fs.Duration(&c.CA.RootTTL, "root-ttl", "CITADEL_SELF_SIGNED_CA_CERT_TTL", c.CA.RootTTL, "lifetime of a self-signed root")
	fs.Duration(&c.CA.CheckInterval, "root-check-interval", "CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL", c.CA.CheckInterval, "how often to check whether the root needs rotating")
	fs.Int(&c.CA.GracePercent, "root-grace-percent", "CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE", c.CA.GracePercent, "rotate the root when less than this percent of its life is left")
	fs.Bool(&c.CA.NewKeyOnRotate, "root-rotate-new-key", "CA_ROOT_ROTATE_NEW_KEY", false, "give a rotated root a new key (default: keep the key, as Istio)")
	fs.String(&c.CA.KEKFile, "ca-kek-file", "CA_KEK_FILE", "", "file with 32 random bytes (raw or base64; mode 0600, or 0440 with a group of this process) sealing the self-signed root keys in KV; required in self-signed mode")
	fs.Duration(&c.CA.RotateMinInterval, "root-rotate-min-interval", "ROOT_ROTATE_MIN_INTERVAL", c.CA.RotateMinInterval, "refuse a forced root rotation this soon after the last rotation (0: no limit)")
}

// bindCerts declares the workload certificates' policy.
func bindCerts(fs *flagenv.Set, c *Config, r *raw) {
	fs.Duration(&c.Certs.DefaultTTL, "default-ttl", "DEFAULT_WORKLOAD_CERT_TTL", c.Certs.DefaultTTL, "workload certificate lifetime when the request asks for none")
	fs.Duration(&c.Certs.PodMaxTTL, "pod-max-ttl", "POD_MAX_WORKLOAD_CERT_TTL", 0, "longest certificate a pod gets (a request recorded for a pod); longer requests are clamped to it and counted (meshagent_signer_ttl_clamped_total); 0: -default-ttl")
	fs.Int(&c.Certs.MaxEarlyPerMinute, "max-early-certs-per-minute", "MAX_EARLY_CERTS_PER_MINUTE", c.Certs.MaxEarlyPerMinute,
		"most certificates one pod (or SPIFFE ID without a pod) is issued per minute by this replica while the one before is less than a quarter through its life; more are refused saying why (a pod that keeps asking refuses what it gets); 0: no limit")
	fs.Duration(&c.Certs.MaxTTL, "max-ttl", "MAX_WORKLOAD_CERT_TTL", c.Certs.MaxTTL, "longest workload certificate lifetime; longer requests are rejected")
	fs.String(&r.signers, "cert-signers", "CERT_SIGNERS", "", "CertSigner names accepted besides the default (empty), comma-separated")
	fs.String(&c.Certs.SignersDir, "cert-signers-dir", "CERT_SIGNERS_DIR", "", "directory of the named signers' CA material, <dir>/<signer>/ with Istio's cacerts file names (default: -cacerts-dir)")
}

// bindAuth declares how bearer tokens are verified.
func bindAuth(fs *flagenv.Set, c *Config, getenv func(string) string) {
	c.Auth.Bind(fs, getenv)
}

// bindRuntime declares the event stream, the workers and the GC target.
func bindRuntime(fs *flagenv.Set, c *Config, r *raw) {
	fs.Int(&c.Stream.Replicas, "stream-replicas", "EVENTS_REPLICAS", c.Stream.Replicas, "replicas of the event stream, if the signer creates it")
	fs.Duration(&c.Stream.MaxAge, "stream-max-age", "EVENTS_MAX_AGE", c.Stream.MaxAge, "history of the event stream, if the signer creates it")
	fs.Int(&c.Workers, "workers", "SIGNER_WORKERS", c.Workers, "concurrent NATS sign requests")
	r.gogc = strconv.Itoa(c.GCPercent)
	fs.String(&r.gogc, "gogc", "GOGC", r.gogc, "garbage-collection target percent, as Go's GOGC (off: none); the signer's live heap is small, so a higher target costs little memory and saves CPU per CSR")
}

// bindFederation declares the bundle endpoint and the foreign domains followed.
func bindFederation(fs *flagenv.Set, c *Config) {
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
}

// bindNodes declares the node agents trusted to impersonate.
func bindNodes(fs *flagenv.Set, c *Config, r *raw, getenv func(string) string) {
	fs.String(&r.trusted, "trusted-node-accounts", "CA_TRUSTED_NODE_ACCOUNTS", "", "node agents (<ns>/<sa>, comma-separated) that may ask for the identity of a workload on their own node (ImpersonatedIdentity); checked by reading pods from the API server")
	fs.String(&c.Nodes.APIURL, "node-api-url", "NODE_API_URL", authn.InClusterURL(getenv), "API server read for -trusted-node-accounts (default in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.String(&c.Nodes.CAFile, "node-api-ca-file", "NODE_API_CA_FILE", "", "PEM roots of -node-api-url (default with -trusted-node-accounts: "+authn.InClusterCAFile+")")
	fs.String(&c.Nodes.BearerFile, "node-api-bearer-file", "NODE_API_BEARER_FILE", "", "the signer's token for -node-api-url, which must allow get and list pods (default with -trusted-node-accounts: "+authn.InClusterTokenFile+")")
}

// bindRootConfigMap declares the publishing of the trust bundle into every namespace.
func bindRootConfigMap(fs *flagenv.Set, c *Config, getenv func(string) string) {
	fs.String(&c.RootConfigMap.Name, "root-configmap", "ROOT_CONFIGMAP", "", "publish the trust bundle (every root, newest first) into every namespace as a ConfigMap of this name, as istiod does with istio-ca-root-cert; created in new namespaces, put back when edited or deleted, rewritten when the roots change; empty: not published")
	fs.String(&c.RootConfigMap.Key, "root-configmap-key", "ROOT_CONFIGMAP_KEY", rootcm.DefaultKey, "the key of -root-configmap that holds the bundle")
	fs.String(&c.RootConfigMap.APIURL, "root-configmap-api-url", "ROOT_CONFIGMAP_API_URL", authn.InClusterURL(getenv), "API server for -root-configmap (default in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.String(&c.RootConfigMap.CAFile, "root-configmap-api-ca-file", "ROOT_CONFIGMAP_API_CA_FILE", "", "PEM roots of -root-configmap-api-url (default with -root-configmap: "+authn.InClusterCAFile+")")
	fs.String(&c.RootConfigMap.BearerFile, "root-configmap-api-bearer-file", "ROOT_CONFIGMAP_API_BEARER_FILE", "", "the signer's token for -root-configmap-api-url, which must allow list and watch namespaces, create configmaps, and get, list, watch and patch the ConfigMaps of -root-configmap (default with -root-configmap: "+authn.InClusterTokenFile+")")
	fs.Duration(&c.RootConfigMap.Resync, "root-configmap-resync", "ROOT_CONFIGMAP_RESYNC", c.RootConfigMap.Resync, "how often the namespaces and ConfigMaps are listed again in full (between lists they are watched)")
}

// complete makes r into c's fields and fills the in-cluster defaults of what is
// set, after parsing failed with perr (nil: it did not); it returns every problem.
func (r raw) complete(c *Config, perr error) []error {
	if accts, err := authn.ParseTrustedAccounts(r.trusted); err != nil {
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
	if c.RA.ExternalCA != "" {
		if c.RA.CAFile == "" {
			c.RA.CAFile = authn.InClusterCAFile
		}
		if c.RA.BearerFile == "" {
			c.RA.BearerFile = authn.InClusterTokenFile
		}
	}
	c.RA.Usages = flagenv.SplitList(r.usages)
	if c.RootConfigMap.Name != "" {
		if c.RootConfigMap.CAFile == "" {
			c.RootConfigMap.CAFile = authn.InClusterCAFile
		}
		if c.RootConfigMap.BearerFile == "" {
			c.RootConfigMap.BearerFile = authn.InClusterTokenFile
		}
	}
	c.Listen.DNSNames = flagenv.SplitList(r.dnsNames)
	if gc, err := parseGOGC(r.gogc); err != nil {
		perr = errors.Join(perr, fmt.Errorf("-gogc: %w", err))
	} else {
		c.GCPercent = gc
	}
	c.Certs.Signers = flagenv.SplitList(r.signers)
	if c.Certs.SignersDir == "" {
		c.Certs.SignersDir = c.CA.Dir
	}
	var errs []error
	if perr != nil {
		errs = append(errs, perr)
	}
	c.Listen.IPs = nil
	for _, s := range flagenv.SplitList(r.ips) {
		ip := net.ParseIP(s)
		if ip == nil {
			errs = append(errs, fmt.Errorf("-grpc-ips: %q is not an IP address", s))
			continue
		}
		c.Listen.IPs = append(c.Listen.IPs, ip)
	}
	alg, err := pki.ParseKeyAlg(r.keyAlg)
	if err != nil {
		errs = append(errs, fmt.Errorf("-key-alg: %w", err))
	}
	c.CA.KeyAlg = alg
	c.Auth.Defaults()
	return errs
}
