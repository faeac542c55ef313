package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestDefaultsResolveUnderPodRoot(t *testing.T) {
	c, err := Load([]string{"-pod", "web-0", "-pod-root", "/pods/web-0"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		c.SDS.Socket:          "/pods/web-0/var/run/secrets/workload-spiffe-uds/socket",
		c.CA.TokenFile:        "/pods/web-0/var/run/secrets/tokens/istio-token",
		c.Cert.CredentialsDir: "/pods/web-0/var/run/secrets/workload-spiffe-credentials",
		c.Cert.FileMountedDir: "/pods/web-0/etc/certs",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	if c.Cert.KeyAlg != pki.ECP256 || c.Cert.TTL != 24*time.Hour || c.SDS.SocketMode != 0o600 || c.Pod.TrustDomain != "cluster.local" {
		t.Errorf("defaults: %+v", c.Cert)
	}
	if id, _ := c.SPIFFEID(); id != "spiffe://cluster.local/ns/default/sa/default" {
		t.Errorf("spiffe id %s", id)
	}
}

// The directories file-cert:/file-root: may read: Istio's mounted-cert places under
// the pod root by default, FILE_CERT_DIRS or the flag otherwise, empty for none.
func TestFileCertDirs(t *testing.T) {
	c, err := Load([]string{"-pod", "web-0", "-pod-root", "/pods/web-0"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Cert.FileCertDirs, ","); got != "/pods/web-0/etc/certs,/pods/web-0/etc/istio,/pods/web-0/var/run/secrets" {
		t.Errorf("default dirs %s", got)
	}
	c, err = Load([]string{"-pod", "web-0", "-pod-root", "/pods/web-0"}, testkit.Env(map[string]string{"FILE_CERT_DIRS": "/etc/ssl/mesh, certs"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Cert.FileCertDirs, ","); got != "/etc/ssl/mesh,/pods/web-0/certs" {
		t.Errorf("FILE_CERT_DIRS: %s", got)
	}
	c, err = Load([]string{"-pod", "web-0", "-file-cert-dirs", ""}, testkit.Env(nil))
	if err != nil || len(c.Cert.FileCertDirs) != 0 {
		t.Errorf("-file-cert-dirs '': %v %v", c.Cert.FileCertDirs, err)
	}
}

func TestIstioEnvNames(t *testing.T) {
	c, err := Load(nil, testkit.Env(map[string]string{
		"POD_NAME": "p", "TRUST_DOMAIN": "example.org", "POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "cart",
		"CA_ADDR": "istiod:15010", "SECRET_TTL": "1h", "OUTPUT_CERTS": "/out", "FILE_MOUNTED_CERTS": "true", "CLUSTER_ID": "east",
		"SDS_SOCKET_MODE": "0660",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := c.SPIFFEID(); id != "spiffe://example.org/ns/shop/sa/cart" {
		t.Errorf("spiffe id %s", id)
	}
	if !c.CA.Plaintext || c.Cert.TTL != time.Hour || c.Cert.OutputDir != "/out" || !c.Cert.FileMounted || c.CA.ClusterID != "east" || c.SDS.SocketMode != 0o660 {
		t.Errorf("config %+v", c)
	}
	// A flag beats the env var.
	c, err = Load([]string{"-secret-ttl", "2h"}, testkit.Env(map[string]string{"POD_NAME": "p", "SECRET_TTL": "1h"}))
	if err != nil || c.Cert.TTL != 2*time.Hour {
		t.Errorf("flag over env: %v %v", c.Cert.TTL, err)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	long := "/" + strings.Repeat("x", 120)
	_, err := Load([]string{"-pod", "Bad Pod!", "-key-alg", "dsa", "-socket-mode", "0777", "-secret-ttl", "0s",
		"-safety-ratio", "1.5", "-socket", long, "-log-level", "loud", "-retry-min", "0s", "-namespace", ""}, testkit.Env(nil))
	if err == nil {
		t.Fatal("want error")
	}
	for _, f := range []string{"-pod", "-key-alg", "-socket-mode", "-secret-ttl", "-safety-ratio", "-socket:", "-log-level", "-retry-min", "-namespace"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
	if _, err := Load(nil, testkit.Env(nil)); err == nil || !strings.Contains(err.Error(), "-pod: required") {
		t.Errorf("missing pod: %v", err)
	}
}

func TestRelativePathsAndAbsolute(t *testing.T) {
	dir := t.TempDir()
	c, err := Load([]string{"-pod", "p", "-pod-root", dir, "-token-file", "/abs/tok", "-output-certs", "out"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.CA.TokenFile != "/abs/tok" || c.Cert.OutputDir != filepath.Join(dir, "out") {
		t.Errorf("paths %s %s", c.CA.TokenFile, c.Cert.OutputDir)
	}
}

func TestTrustAnchorsFile(t *testing.T) {
	root := t.TempDir()
	load := func(args []string, e map[string]string) string {
		t.Helper()
		c, err := Load(append([]string{"-pod", "web-0", "-pod-root", root}, args...), testkit.Env(e))
		if err != nil {
			t.Fatal(err)
		}
		return c.CA.TrustAnchorsFile
	}
	if got := load(nil, nil); got != "" {
		t.Fatalf("without Istio's root-cert.pem: %q, want none (trust on first use)", got)
	}
	istio := filepath.Join(root, DefaultTrustAnchors)
	if err := os.MkdirAll(filepath.Dir(istio), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(istio, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := load(nil, nil); got != istio {
		t.Fatalf("with Istio's root-cert.pem: %q", got)
	}
	if got := load([]string{"-trust-anchors-file", "mine.pem"}, nil); got != filepath.Join(root, "mine.pem") {
		t.Fatalf("flag: %q", got)
	}
	if got := load(nil, map[string]string{"TRUST_ANCHORS_FILE": "/etc/anchors.pem"}); got != "/etc/anchors.pem" {
		t.Fatalf("env: %q", got)
	}
}

// The CA counts the TTL in whole seconds: a shorter one is refused here, naming the
// flag, rather than refused on every CSR.
func TestSecretTTLUnderASecondIsRefused(t *testing.T) {
	_, err := Load([]string{"-pod", "p", "-secret-ttl", "500ms"}, testkit.Env(nil))
	if err == nil || !strings.Contains(err.Error(), "-secret-ttl: must be at least 1s") {
		t.Fatalf("-secret-ttl 500ms: %v", err)
	}
}

// TestIstioKeyEnv: -key-alg wins; else ECC_SIGNATURE_ALGORITHM=ECDSA with
// ECC_CURVE; else EC-P256 (Istio would take RSA-2048: docs/istio.md). Values
// Istio does not have are refused, and so are -key-alg and ECC_* that disagree.
func TestIstioKeyEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want pki.KeyAlg
		err  string
	}{
		{name: "default", want: pki.ECP256},
		{name: "ecdsa", env: map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA"}, want: pki.ECP256},
		{name: "ecdsa p384", env: map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA", "ECC_CURVE": "P384"}, want: pki.ECP384},
		{name: "key-alg", env: map[string]string{"KEY_ALG": "RSA-2048"}, want: pki.RSA2048},
		{name: "agreeing", env: map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA"}, args: []string{"-key-alg", "EC-P256"}, want: pki.ECP256},
		{name: "disagreeing", env: map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA"}, args: []string{"-key-alg", "RSA-2048"}, err: "disagree"},
		{name: "bad curve", env: map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA", "ECC_CURVE": "P521"}, err: "-ecc-curve"},
		{name: "bad algorithm", env: map[string]string{"ECC_SIGNATURE_ALGORITHM": "ED25519"}, err: "-ecc-signature-algorithm"},
		{name: "bad cert provider", env: map[string]string{"PILOT_CERT_PROVIDER": "vault"}, err: "-pilot-cert-provider"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(append([]string{"-pod", "web-0"}, tc.args...), func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Load: %v, want an error naming %s", err, tc.err)
				}
				return
			}
			if err != nil || c.Cert.KeyAlg != tc.want {
				t.Fatalf("key %s, %v; want %s", c.Cert.KeyAlg, err, tc.want)
			}
		})
	}
	env := map[string]string{"PILOT_CERT_PROVIDER": "kubernetes", "CA_ADDR": "istiod:15012", "ISTIO_META_CERT_SIGNER": "partner"}
	c, err := Load([]string{"-pod", "web-0", "-pod-root", "/p"}, func(k string) string { return env[k] })
	if err != nil || c.CA.RootCert != "/p/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" || c.Cert.Signer != "partner" {
		t.Fatalf("kubernetes provider: roots %q signer %q, %v", c.CA.RootCert, c.Cert.Signer, err)
	}
}

// CA_ROOT_CA is read as Istio's agent reads it (pkg/istio-agent FindRootCAForCA):
// SYSTEM is the host's trust store, a file is the CA's roots (under the pod root),
// and either comes before PILOT_CERT_PROVIDER's default; meshagent's own
// CA_ROOT_CERT is the same knob, so giving both is an error.
func TestCARootCAAsIstiosAgentReadsIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		root   string
		system bool
		err    string
	}{
		{name: "SYSTEM", env: map[string]string{"CA_ROOT_CA": "SYSTEM"}, system: true},
		{name: "a file, before the provider's", env: map[string]string{"CA_ROOT_CA": "etc/ca/root.pem", "PILOT_CERT_PROVIDER": "kubernetes"}, root: "/p/etc/ca/root.pem"},
		{name: "an absolute file", env: map[string]string{"CA_ROOT_CA": "/etc/pki/ca.pem"}, root: "/etc/pki/ca.pem"},
		{name: "unset: the provider's", env: map[string]string{"PILOT_CERT_PROVIDER": "custom"}, root: "/p/etc/certs/root-cert.pem"},
		{name: "both names", env: map[string]string{"CA_ROOT_CA": "SYSTEM", "CA_ROOT_CERT": "/r.pem"}, err: "set one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["CA_ADDR"] = "istiod.istio-system.svc:15012"
			c, err := Load([]string{"-pod", "web-0", "-pod-root", "/p"}, func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Load: %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil || c.CA.RootCert != tc.root || c.CA.SystemRoots != tc.system {
				t.Fatalf("roots %q system %v, %v; want %q system %v", c.CA.RootCert, c.CA.SystemRoots, err, tc.root, tc.system)
			}
		})
	}
}
