package config

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestDefaults(t *testing.T) {
	c, err := Load([]string{"-instance", "s1", "-ca-kek-file", "/run/secrets/ca-kek"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.TrustDomain != "cluster.local" || c.Listen.GRPC != ":15012" || c.CA.KeyAlg != pki.ECP256 ||
		c.CA.RootTTL != 10*365*24*time.Hour || c.CA.CheckInterval != time.Hour || c.CA.GracePercent != 20 ||
		c.Certs.DefaultTTL != 24*time.Hour || c.Certs.MaxTTL != 90*24*time.Hour || c.Auth.Audience != "istio-ca" ||
		c.CA.KVBucket != "meshagent-ca" || strings.Join(c.Listen.DNSNames, ",") != "istiod.istio-system.svc,localhost" ||
		len(c.Listen.IPs) != 1 || c.Listen.IPs[0].String() != "127.0.0.1" || c.CA.RotateMinInterval != time.Minute {
		t.Fatalf("defaults %+v", c)
	}
}

func TestIstioEnvNamesAndFlagsWin(t *testing.T) {
	c, err := Load([]string{"-root-ttl", "5m", "-key-alg", "rsa-4096"}, testkit.Env(map[string]string{
		"TRUST_DOMAIN":                                          "example.org",
		"CITADEL_SELF_SIGNED_CA_CERT_TTL":                       "1h",
		"CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL":          "30s",
		"CITADEL_SELF_SIGNED_ROOT_CERT_GRACE_PERIOD_PERCENTILE": "50",
		"DEFAULT_WORKLOAD_CERT_TTL":                             "1h",
		"MAX_WORKLOAD_CERT_TTL":                                 "48h",
		"SIGNER_INSTANCE":                                       "s2",
		"CERT_SIGNERS":                                          "a, b",
		"CA_KEK_FILE":                                           "/run/secrets/ca-kek",
		"ROOT_ROTATE_MIN_INTERVAL":                              "0",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.TrustDomain != "example.org" || c.CA.RootTTL != 5*time.Minute || c.CA.CheckInterval != 30*time.Second ||
		c.CA.GracePercent != 50 || c.Certs.DefaultTTL != time.Hour || c.Certs.MaxTTL != 48*time.Hour ||
		c.CA.KeyAlg != pki.RSA4096 || c.Instance != "s2" || strings.Join(c.Certs.Signers, "|") != "a|b" ||
		c.CA.KEKFile != "/run/secrets/ca-kek" || c.CA.RotateMinInterval != 0 {
		t.Fatalf("config %+v", c)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	_, err := Load([]string{
		"-instance", "s", "-trust-domain", "Not A Domain", "-key-alg", "dsa", "-root-ttl", "1s", "-root-grace-percent", "100",
		"-default-ttl", "48h", "-max-ttl", "24h", "-jwks-file", "a", "-jwks-url", "http://b", "-grpc-ips", "nope", "-workers", "0", "-root-rotate-min-interval", "-1s",
	}, testkit.Env(map[string]string{"CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL": "3600"}))
	if err == nil {
		t.Fatal("want error")
	}
	for _, f := range []string{"-trust-domain", "-key-alg", "-root-ttl", "-root-grace-percent", "-max-ttl", "-jwks-file", "-grpc-ips", "-workers", "CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL", "-ca-kek-file", "-root-rotate-min-interval"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
}

// Plugged-in mode needs no KEK: the operator's directory holds the key.
func TestKEKRequiredOnlyInSelfSignedMode(t *testing.T) {
	if _, err := Load([]string{"-instance", "s"}, testkit.Env(nil)); err == nil || !strings.Contains(err.Error(), "-ca-kek-file: required in self-signed mode") {
		t.Fatalf("self-signed without a KEK: %v", err)
	}
	if _, err := Load([]string{"-instance", "s", "-cacerts-dir", "/etc/cacerts"}, testkit.Env(nil)); err != nil {
		t.Fatalf("plugged-in without a KEK: %v", err)
	}
}

func TestBusCalloutNeedsItsUserAndAVerifier(t *testing.T) {
	_, err := Load([]string{"-bus-callout-seed", "issuer.nk"}, func(string) string { return "" })
	for _, want := range []string{"-bus-callout-nkey: required", "needs -jwks-file, -jwks-url, -token-issuer-discovery or -token-review"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	c, err := Load([]string{"-bus-callout-seed", "issuer.nk", "-bus-callout-nkey", "callout.nk", "-jwks-file", "jwks.json", "-nats-nkey", "signer.nk", "-ca-kek-file", "kek"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if c.Bus.NKeyFile != "signer.nk" || c.Bus.InboxPrefix != "_INBOX.signer" {
		t.Fatalf("bus config %+v", c.Bus)
	}
}

// -bus-sign-id trusts identities in subjects only this signer's callout grants:
// refused without -bus-callout-seed, naming the flag; accepted with it.
func TestBusSignIDOnlyWithTheCallout(t *testing.T) {
	_, err := Load([]string{"-instance", "s", "-ca-kek-file", "kek", "-jwks-file", "jwks.json", "-token-issuer", "i", "-bus-sign-id"}, testkit.Env(nil))
	if err == nil || !strings.Contains(err.Error(), "-bus-sign-id: only with -bus-callout-seed") {
		t.Fatalf("got %v", err)
	}
	c, err := Load([]string{"-bus-callout-seed", "issuer.nk", "-bus-callout-nkey", "callout.nk", "-jwks-file", "jwks.json", "-nats-nkey", "signer.nk", "-ca-kek-file", "kek"},
		testkit.Env(map[string]string{"BUS_SIGN_ID": "true"}))
	if err != nil || !c.BusCallout.SignByIdentity {
		t.Fatalf("with the callout: %v, sign by identity %v", err, c.BusCallout.SignByIdentity)
	}
}

// In a cluster the signer finds the JWKS through the service-account issuer's OIDC
// discovery document, over the cluster CA, with its own token.
func TestTokenIssuerDiscovery(t *testing.T) {
	base := []string{"-instance", "s", "-ca-kek-file", "kek"}
	c, err := Load(base, testkit.Env(map[string]string{
		"TOKEN_ISSUER_DISCOVERY":   "true",
		"TOKEN_ISSUER":             "https://kubernetes.default.svc.cluster.local",
		"TOKEN_ISSUER_CA_FILE":     "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
		"TOKEN_ISSUER_BEARER_FILE": "/var/run/secrets/kubernetes.io/serviceaccount/token",
		"JWKS_REFRESH":             "1m",
		"JWKS_MIN_REFRESH":         "5s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Auth.Discover || c.Auth.Issuer != "https://kubernetes.default.svc.cluster.local" || c.Auth.JWKSRefresh != time.Minute ||
		c.Auth.JWKSMinRefresh != 5*time.Second || c.Auth.CAFile == "" || c.Auth.BearerFile == "" {
		t.Fatalf("auth %+v", c.Auth)
	}
	if d := Default(); d.Auth.JWKSMinRefresh != 10*time.Second || d.Auth.Discover {
		t.Fatalf("default auth %+v", d.Auth)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"discovery needs an https issuer", []string{"-token-issuer-discovery"}, `-token-issuer: must be an https URL with -token-issuer-discovery, got "meshagent-dev"`},
		{"discovery and a JWKS URL", []string{"-token-issuer-discovery", "-token-issuer", "https://k", "-jwks-url", "https://k/jwks"}, "set one, not several"},
		{"discovery and a JWKS file", []string{"-token-issuer-discovery", "-token-issuer", "https://k", "-jwks-file", "j"}, "set one, not several"},
		{"TLS settings for a file", []string{"-jwks-file", "j", "-token-issuer-ca-file", "ca.crt"}, "only with -jwks-url, -token-issuer-discovery or -token-review"},
		{"negative min refresh", []string{"-jwks-min-refresh", "-1s"}, "-jwks-min-refresh: must not be negative"},
		{"bad bool in env", nil, "TOKEN_ISSUER_DISCOVERY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := testkit.Env(nil)
			if tt.args == nil {
				e = testkit.Env(map[string]string{"TOKEN_ISSUER_DISCOVERY": "maybe"})
			}
			if _, err := Load(append(append([]string{}, base...), tt.args...), e); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	// The callout accepts discovery as its verifier.
	if _, err := Load(append(base, "-bus-callout-seed", "i.nk", "-bus-callout-nkey", "c.nk", "-token-issuer-discovery", "-token-issuer", "https://k"), testkit.Env(nil)); err != nil {
		t.Fatalf("callout with discovery: %v", err)
	}
}

// Where discovery is not reachable, TokenReview: in a pod it needs no more than the
// flag (the API server's address and the service account's files are the pod's).
func TestTokenReview(t *testing.T) {
	base := []string{"-instance", "s", "-ca-kek-file", "kek"}
	inPod := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
	c, err := Load(append(base, "-token-review", "-bus-callout-seed", "i.nk", "-bus-callout-nkey", "c.nk"), testkit.Env(inPod))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Auth.TokenReview || c.Auth.TokenReviewURL != "https://10.96.0.1:443" || c.Auth.Audience != "istio-ca" || c.Auth.TokenReviewCache != time.Minute ||
		c.Auth.CAFile != "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" || c.Auth.BearerFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Fatalf("auth %+v", c.Auth)
	}
	withEnv := map[string]string{"TOKEN_REVIEW": "true", "TOKEN_REVIEW_URL": "https://api.example:6443", "TOKEN_ISSUER_CA_FILE": "/etc/k8s/ca.crt", "TOKEN_REVIEW_CACHE": "30s"}
	if c, err = Load(base, testkit.Env(withEnv)); err != nil || c.Auth.TokenReviewURL != "https://api.example:6443" || c.Auth.CAFile != "/etc/k8s/ca.crt" || c.Auth.TokenReviewCache != 30*time.Second {
		t.Fatalf("from env: %+v, %v", c.Auth, err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"outside a pod without a URL", []string{"-token-review"}, nil, "-token-review-url: must be an https URL"},
		{"plain http", []string{"-token-review", "-token-review-url", "http://10.96.0.1:443"}, nil, "-token-review-url: must be an https URL"},
		{"with discovery", []string{"-token-review", "-token-issuer-discovery", "-token-issuer", "https://k"}, inPod, "set one, not several"},
		{"cache too long", []string{"-token-review", "-token-review-cache", "1h"}, inPod, "-token-review-cache: must be between"},
		{"no audience", []string{"-token-review", "-token-audience", ""}, inPod, "-token-audience: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Load(append(append([]string{}, base...), tt.args...), testkit.Env(tt.env)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// Process hands the lifecycle what it reads itself: the name, the logger, the
// health address and the bus, as the flags set them.
func TestProcess(t *testing.T) {
	c, err := Load([]string{"-instance", "s1", "-ca-kek-file", "/run/secrets/ca-kek", "-http-addr", "127.0.0.1:9999",
		"-log-level", "debug", "-nats-url", "nats://bus:4222"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Process()
	if p.Name != "signer" || p.HTTP != "127.0.0.1:9999" || p.Log.Level != "debug" || p.Bus == nil ||
		p.Bus.URL != "nats://bus:4222" || p.Bus.Name != "signer-s1" {
		t.Fatalf("process %+v (bus %+v)", p, p.Bus)
	}
}

// CA_TRUSTED_NODE_ACCOUNTS as Istio spells it; in a pod the API server and the
// service account's files are the defaults; a malformed entry or no https API server
// is refused naming the flag. CERT_SIGNERS_DIR defaults to -cacerts-dir.
func TestTrustedNodeAccountsAndSignersDir(t *testing.T) {
	base := []string{"-instance", "s", "-ca-kek-file", "kek"}
	inPod := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
		"CA_TRUSTED_NODE_ACCOUNTS": "istio-system/ztunnel, kube-system/agent"}
	c, err := Load(base, testkit.Env(inPod))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Nodes.TrustedAccounts, "|") != "istio-system/ztunnel|kube-system/agent" || c.Nodes.APIURL != "https://10.96.0.1:443" ||
		c.Nodes.CAFile != "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" || c.Nodes.BearerFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Fatalf("nodes %+v", c.Nodes)
	}
	if _, err := Load(base, testkit.Env(map[string]string{"CA_TRUSTED_NODE_ACCOUNTS": "ztunnel"})); err == nil || !strings.Contains(err.Error(), "-trusted-node-accounts: want <namespace>/<serviceaccount>") {
		t.Fatalf("malformed: %v", err)
	}
	if _, err := Load(base, testkit.Env(map[string]string{"CA_TRUSTED_NODE_ACCOUNTS": "a/b"})); err == nil || !strings.Contains(err.Error(), "-node-api-url: must be an https URL") {
		t.Fatalf("no API server: %v", err)
	}
	c, err = Load(append(base, "-cacerts-dir", "/etc/cacerts", "-cert-signers", "partner"), testkit.Env(nil))
	if err != nil || c.Certs.SignersDir != "/etc/cacerts" {
		t.Fatalf("signers dir %q, %v", c.Certs.SignersDir, err)
	}
}

func TestBundleEndpointSPIFFEProfile(t *testing.T) {
	base := []string{"-instance", "s1", "-ca-kek-file", "/k", "-bundle-endpoint-addr", ":8443"}
	c, err := Load(append(base, "-bundle-endpoint-spiffe-id", "spiffe://cluster.local/ns/istio-system/sa/bundle",
		"-spiffe-bundle-endpoints", "west.example|https://w/b|spiffe://west.example/e", "-spiffe-bundle-files", "west.example|/w.json"), testkit.Env(nil))
	if err != nil || c.Federation.SPIFFEID == "" {
		t.Fatalf("https_spiffe both ways: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-bundle-endpoint-spiffe-id", "spiffe://other.example/x"}, "not in this trust domain"},
		{[]string{"-bundle-endpoint-spiffe-id", "spiffe://cluster.local/x", "-bundle-endpoint-cert", "c", "-bundle-endpoint-key", "k"}, "not with -bundle-endpoint-cert"},
		{[]string{"-spiffe-bundle-endpoints", "west.example|https://w/b|spiffe://west.example/e"}, "needs the domain's bundle once"},
		{[]string{"-spiffe-bundle-endpoints", "west.example|https://w/b|spiffe://east.example/e"}, "not in trust domain west.example"},
	} {
		if _, err := Load(append(base, tc.args...), testkit.Env(nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, err := Load([]string{"-instance", "s1", "-ca-kek-file", "/k", "-bundle-endpoint-spiffe-id", "spiffe://cluster.local/x"}, testkit.Env(nil)); err == nil {
		t.Error("-bundle-endpoint-spiffe-id without -bundle-endpoint-addr accepted")
	}
}

// TestGCPercentAndPprof: the GC target is the signer's default, Go's GOGC when
// set (off included), or -gogc; a bad one is named. -pprof-addr must be loopback.
func TestGCPercentAndPprof(t *testing.T) {
	base := []string{"-instance", "s1", "-ca-kek-file", "/run/secrets/ca-kek"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int
		err  string
	}{
		{want: DefaultGCPercent},
		{env: map[string]string{"GOGC": "200"}, want: 200},
		{env: map[string]string{"GOGC": "off"}, want: -1},
		{args: []string{"-gogc", "50"}, env: map[string]string{"GOGC": "200"}, want: 50},
		{args: []string{"-gogc", "lots"}, err: "-gogc"},
		{args: []string{"-gogc", "0"}, err: "-gogc"},
		{args: []string{"-pprof-addr", "127.0.0.1:6060"}, want: DefaultGCPercent},
		{args: []string{"-pprof-addr", "[::1]:6060"}, want: DefaultGCPercent},
		{args: []string{"-pprof-addr", ":6060"}, err: "-pprof-addr"},
		{args: []string{"-pprof-addr", "10.0.0.1:6060"}, err: "-pprof-addr"},
	} {
		c, err := Load(append(append([]string{}, base...), tc.args...), testkit.Env(tc.env))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v %v: %v, want an error naming %s", tc.args, tc.env, err, tc.err)
			}
		case err != nil:
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		case c.GCPercent != tc.want:
			t.Errorf("%v %v: GC percent %d, want %d", tc.args, tc.env, c.GCPercent, tc.want)
		}
	}
}

// A pod's bus user and certificate are bounded by default, the bounds are flags
// (and env), and unusable ones are refused naming the flag.
func TestPodLimits(t *testing.T) {
	base := []string{"-bus-callout-seed", "issuer.nk", "-bus-callout-nkey", "callout.nk", "-jwks-file", "jwks.json", "-nats-nkey", "signer.nk", "-ca-kek-file", "kek"}
	c, err := Load(base, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.BusCallout.Pods; p.Lifetime != time.Hour || p.MaxAdmissions != 32 || p.MaxPayload != 72<<10 || p.MaxSubs != 32 || p.Jitter != 0.1 || c.Certs.PodMaxTTL != 0 {
		t.Fatalf("defaults %+v, pod max ttl %s", p, c.Certs.PodMaxTTL)
	}
	c, err = Load(append(base, "-bus-pod-max-connections", "4", "-pod-max-ttl", "2h"), testkit.Env(map[string]string{"BUS_POD_USER_LIFETIME": "10m"}))
	if err != nil || c.BusCallout.Pods.Lifetime != 10*time.Minute || c.BusCallout.Pods.MaxAdmissions != 4 || c.Certs.PodMaxTTL != 2*time.Hour {
		t.Fatalf("%v: %+v, %s", err, c.BusCallout.Pods, c.Certs.PodMaxTTL)
	}
	_, err = Load(append(base, "-bus-pod-max-connections", "0", "-bus-pod-user-lifetime", "1s", "-pod-max-ttl", "2400h"), testkit.Env(nil))
	for _, want := range []string{"-bus-pod-*", "admissions", "lifetime", "-pod-max-ttl"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

// -root-configmap: off by default; on, it takes the in-cluster API server, CA and
// token unless told otherwise, and a bad name, key, URL or resync is refused
// naming the flag.
func TestRootConfigMap(t *testing.T) {
	base := []string{"-instance", "s1", "-ca-kek-file", "/run/secrets/ca-kek"}
	c, err := Load(base, testkit.Env(nil))
	if err != nil || c.RootConfigMap.Name != "" {
		t.Fatalf("default: %q, %v", c.RootConfigMap.Name, err)
	}
	inPod := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "ROOT_CONFIGMAP": "istio-ca-root-cert"}
	c, err = Load(base, testkit.Env(inPod))
	if err != nil {
		t.Fatal(err)
	}
	rc := c.RootConfigMap
	if rc.Name != "istio-ca-root-cert" || rc.Key != "root-cert.pem" || rc.APIURL != "https://10.96.0.1:443" ||
		rc.CAFile != "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" || rc.BearerFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" || rc.Resync != 5*time.Minute {
		t.Fatalf("in a pod: %+v", rc)
	}
	_, err = Load(append(base, "-root-configmap", "Root_Cert", "-root-configmap-key", "a/b", "-root-configmap-resync", "1s"), testkit.Env(nil))
	if err == nil {
		t.Fatal("bad root configmap settings accepted")
	}
	for _, f := range []string{"-root-configmap:", "-root-configmap-key", "-root-configmap-api-url", "-root-configmap-resync"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
}

// The registration-authority mode reads istiod's EXTERNAL_CA and K8S_SIGNER,
// defaults to istiod's external-ca-cert path and the in-cluster API server, and
// refuses, naming the flag, what kube-controller-manager's signers would refuse.
func TestRegistrationAuthority(t *testing.T) {
	base := []string{"-instance", "s1", "-ca-kek-file", "/run/secrets/ca-kek"}
	c, err := Load(base, testkit.Env(nil))
	if err != nil || c.RA.ExternalCA != "" {
		t.Fatalf("default: %q, %v", c.RA.ExternalCA, err)
	}
	inPod := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
		"EXTERNAL_CA": "ISTIOD_RA_KUBERNETES_API", "K8S_SIGNER": "kubernetes.io/kube-apiserver-client",
		"K8S_SIGNER_USAGES": "digital signature, client auth"}
	c, err = Load(base, testkit.Env(inPod))
	if err != nil {
		t.Fatal(err)
	}
	ra := c.RA
	if ra.Signer != "kubernetes.io/kube-apiserver-client" || ra.RootsFile != "./etc/external-ca-cert/root-cert.pem" ||
		ra.APIURL != "https://10.96.0.1:443" || ra.CAFile != "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" ||
		ra.BearerFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" || ra.Timeout != time.Minute ||
		strings.Join(ra.Usages, "|") != "digital signature|client auth" {
		t.Fatalf("in a pod: %+v", ra)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		says []string
	}{
		{"no signer name", map[string]string{"EXTERNAL_CA": "ISTIOD_RA_KUBERNETES_API"}, nil, []string{"-k8s-signer (K8S_SIGNER): required", "-k8s-csr-api-url"}},
		{"another integration", map[string]string{"EXTERNAL_CA": "VAULT", "K8S_SIGNER": "example.com/s"}, []string{"-k8s-csr-api-url", "https://k"}, []string{"-external-ca (EXTERNAL_CA)"}},
		{"a signer without URI SANs", map[string]string{"EXTERNAL_CA": "ISTIOD_RA_KUBERNETES_API", "K8S_SIGNER": "kubernetes.io/kubelet-serving"}, []string{"-k8s-csr-api-url", "https://k"}, []string{"cannot certify a SPIFFE ID"}},
		{"istiod's usages at kcm's client signer", map[string]string{"EXTERNAL_CA": "ISTIOD_RA_KUBERNETES_API", "K8S_SIGNER": "kubernetes.io/kube-apiserver-client"}, []string{"-k8s-csr-api-url", "https://k"}, []string{`not "server auth"`}},
		{"an unknown usage, a short TTL, named signers", map[string]string{"EXTERNAL_CA": "ISTIOD_RA_KUBERNETES_API", "K8S_SIGNER": "example.com/s", "K8S_SIGNER_USAGES": "client auth,flying"},
			[]string{"-k8s-csr-api-url", "https://k", "-default-ttl", "5m", "-cert-signers", "a", "-k8s-csr-timeout", "0s"}, []string{`"flying" is not a key usage`, "-default-ttl: at least 10m", "-cert-signers (CERT_SIGNERS): not with -external-ca", "-k8s-csr-timeout"}},
		{"a signer name without the mode", map[string]string{"K8S_SIGNER": "example.com/s"}, nil, []string{"-k8s-signer (K8S_SIGNER): only with -external-ca"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(append(append([]string{}, base...), tc.args...), testkit.Env(tc.env))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q: %v", s, err)
				}
			}
		})
	}
}

// TestOperatorDocsStateThePerPodBound: the per-pod bound on early certificates
// refuses a pod's requests, so the page an operator reads (docs/kubernetes.md)
// states it: the flag, its env var and the default this config really has.
func TestOperatorDocsStateThePerPodBound(t *testing.T) {
	b, err := os.ReadFile("../../../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	def := Default().Certs.MaxEarlyPerMinute
	for _, want := range []string{
		"-max-early-certs-per-minute", "MAX_EARLY_CERTS_PER_MINUTE",
		fmt.Sprintf("at most **%d early\ncertificates a minute**", def), `reason="reissue_limit"`, "resource_exhausted",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/kubernetes.md does not say %q", want)
		}
	}
}
