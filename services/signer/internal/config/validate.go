package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/services/signer/internal/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	c.validateListen(&p)
	c.validateCA(&p)
	c.validateCerts(&p)
	tokens := c.validateAuth(&p)
	c.validateCallout(&p, tokens)
	c.validateRootConfigMap(&p)
	c.validateRuntime(&p)
	c.validateFederation(&p)
	c.validateRA(&p)
	return p.Err()
}

// validateListen checks the process, the instance, what it listens on and its trust domain.
func (c Config) validateListen(p *flagenv.Problems) {
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
}

// validateCA checks the CA material's source.
func (c Config) validateCA(p *flagenv.Problems) {
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
}

// validateCerts checks the workload certificates' policy.
func (c Config) validateCerts(p *flagenv.Problems) {
	p.Check(c.Certs.DefaultTTL > 0, "-default-ttl: must be positive")
	p.Check(c.Certs.PodMaxTTL >= 0 && c.Certs.PodMaxTTL <= c.Certs.MaxTTL, "-pod-max-ttl: must be between 0 (-default-ttl) and -max-ttl (%s)", c.Certs.MaxTTL)
	p.Check(c.Certs.MaxEarlyPerMinute >= 0, "-max-early-certs-per-minute: must not be negative")
	p.Check(c.Certs.MaxTTL >= c.Certs.DefaultTTL, "-max-ttl: must be at least -default-ttl (%s)", c.Certs.DefaultTTL)
}

// validateAuth checks how bearer tokens are verified; it returns how many ways
// are set (0: tokens are refused).
func (c Config) validateAuth(p *flagenv.Problems) (sources int) {
	sources = c.Auth.Sources()
	c.Auth.Validate(p)
	if len(c.Nodes.TrustedAccounts) > 0 {
		p.Check(strings.HasPrefix(c.Nodes.APIURL, "https://"), "-node-api-url: must be an https URL with -trusted-node-accounts, got %q (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)", c.Nodes.APIURL)
	}
	return sources
}

// validateCallout checks the bus auth callout, which needs one of the tokens
// ways validateAuth counted to verify pods' tokens.
func (c Config) validateCallout(p *flagenv.Problems, tokens int) {
	if c.BusCallout.IssuerSeed != "" {
		p.Check(c.BusCallout.NKeyFile != "", "-bus-callout-nkey: required with -bus-callout-seed")
		if err := c.BusCallout.Pods.Validate(); err != nil {
			p.Add(fmt.Errorf("-bus-pod-*: %w", err))
		}
		p.Check(tokens > 0, "-bus-callout-seed: needs -jwks-file, -jwks-url, -token-issuer-discovery or -token-review to verify pods' tokens")
	} else {
		p.Check(c.BusCallout.NKeyFile == "", "-bus-callout-nkey: set only with -bus-callout-seed")
		p.Check(!c.BusCallout.SignByIdentity, "-bus-sign-id: only with -bus-callout-seed (without this signer's callout, the subject proves nothing)")
		p.Check(len(c.BusCallout.NodeAgents) == 0, "-node-agent-accounts: only with -bus-callout-seed (the callout admits the nodes)")
	}
	for _, a := range c.BusCallout.NodeAgents {
		ns, sa, ok := strings.Cut(a, "/")
		p.Check(ok && ns != "" && sa != "" && !strings.Contains(sa, "/"), "-node-agent-accounts: %q is not <namespace>/<service account>", a)
	}
}

// validateRootConfigMap checks the publishing of the trust bundle into every namespace.
func (c Config) validateRootConfigMap(p *flagenv.Problems) {
	if c.RootConfigMap.Name != "" {
		p.Check(dnsSubdomain.MatchString(c.RootConfigMap.Name) && len(c.RootConfigMap.Name) <= 253, "-root-configmap: %q is not a ConfigMap name (lowercase letters, digits, '-' and '.', at most 253)", c.RootConfigMap.Name)
		p.Check(configMapKey.MatchString(c.RootConfigMap.Key) && len(c.RootConfigMap.Key) <= 253, "-root-configmap-key: %q is not a ConfigMap key (letters, digits, '-', '_' and '.', at most 253)", c.RootConfigMap.Key)
		p.Check(strings.HasPrefix(c.RootConfigMap.APIURL, "https://"), "-root-configmap-api-url: must be an https URL with -root-configmap, got %q (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)", c.RootConfigMap.APIURL)
		p.Check(c.RootConfigMap.Resync >= 10*time.Second, "-root-configmap-resync: must be at least 10s")
	}
}

// validateRuntime checks the event stream, the workers and the GC target.
func (c Config) validateRuntime(p *flagenv.Problems) {
	p.Check(c.Stream.Replicas >= 1, "-stream-replicas: must be at least 1")
	p.Check(c.Stream.MaxAge > 0, "-stream-max-age: must be positive")
	p.Check(c.Workers >= 1, "-workers: must be at least 1")
	p.Check(c.GCPercent == -1 || c.GCPercent >= 1, "-gogc: must be a positive percent or off")
}

// validateFederation checks the bundle endpoint and the foreign domains followed.
func (c Config) validateFederation(p *flagenv.Problems) {
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

// Signer names of kube-controller-manager's signers that cannot certify a
// SPIFFE ID: the API server refuses legacy-unknown in certificates.k8s.io/v1,
// and both kubelet signers refuse a URI SAN.
var noSPIFFESigners = []string{"kubernetes.io/legacy-unknown", "kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet"}

// kubeUsages are the key usages the CSR API accepts (certificates.k8s.io/v1).
var kubeUsages = []string{"signing", "digital signature", "content commitment", "key encipherment", "key agreement",
	"data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
	"client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
	"ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"}

// validateRA checks the registration-authority mode.
func (c Config) validateRA(p *flagenv.Problems) {
	ra := c.RA
	if ra.ExternalCA == "" {
		p.Check(ra.Signer == "", "-k8s-signer (K8S_SIGNER): only with -external-ca=%s", ExternalCAKubernetes)
		return
	}
	if ra.ExternalCA != ExternalCAKubernetes {
		p.Addf("-external-ca (EXTERNAL_CA): %q is not %s, the one integration there is", ra.ExternalCA, ExternalCAKubernetes)
	}
	p.Check(ra.Signer != "", "-k8s-signer (K8S_SIGNER): required with -external-ca (the signerName of the CSRs)")
	p.Check(!slices.Contains(noSPIFFESigners, ra.Signer), "-k8s-signer (K8S_SIGNER): %s cannot certify a SPIFFE ID (the API server or the signer refuses a URI SAN); kube-controller-manager's kubernetes.io/kube-apiserver-client can", ra.Signer)
	for _, u := range ra.Usages {
		p.Check(slices.Contains(kubeUsages, u), "-k8s-signer-usages (K8S_SIGNER_USAGES): %q is not a key usage of the CSR API", u)
	}
	p.Check(len(ra.Usages) > 0, "-k8s-signer-usages (K8S_SIGNER_USAGES): required")
	if ra.Signer == "kubernetes.io/kube-apiserver-client" {
		for _, u := range ra.Usages {
			p.Check(u == "digital signature" || u == "key encipherment" || u == "client auth",
				"-k8s-signer-usages (K8S_SIGNER_USAGES): kubernetes.io/kube-apiserver-client signs only digital signature, key encipherment and client auth, not %q (it fails the CSR)", u)
		}
		p.Check(slices.Contains(ra.Usages, "client auth"), "-k8s-signer-usages (K8S_SIGNER_USAGES): kubernetes.io/kube-apiserver-client needs client auth")
	}
	p.Check(ra.RootsFile != "", "-external-ca-cert-file (EXTERNAL_CA_CERT_FILE): required with -external-ca")
	p.Check(ra.Timeout >= time.Second, "-k8s-csr-timeout (K8S_CSR_TIMEOUT): must be at least 1s")
	p.Check(strings.HasPrefix(ra.APIURL, "https://"), "-k8s-csr-api-url (K8S_CSR_API_URL): must be an https URL with -external-ca, got %q (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)", ra.APIURL)
	p.Check(len(c.Certs.Signers) == 0, "-cert-signers (CERT_SIGNERS): not with -external-ca (every certificate comes from the -k8s-signer)")
	p.Check(c.Certs.DefaultTTL >= 10*time.Minute, "-default-ttl: at least 10m with -external-ca (the CSR API's shortest certificate)")
}
