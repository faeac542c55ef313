package config

import (
	"github.com/meshagent/meshagent/pkg/events"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		environ []string
		check   func(t *testing.T, c Config)
	}{
		{"paths under pod root", []string{"-pod", "web-0", "-pod-root", "/pods/web-0", "-token-file", "tok", "-xds-tls", "plaintext"}, nil, nil,
			func(t *testing.T, c Config) {
				if c.Socket != filepath.Join("/pods/web-0", "etc/istio/proxy/XDS") || c.Upstream.TokenFile != "/pods/web-0/tok" ||
					c.SDSSocket != "/pods/web-0/var/run/secrets/workload-spiffe-uds/socket" {
					t.Fatalf("socket %s token %s sds %s", c.Socket, c.Upstream.TokenFile, c.SDSSocket)
				}
			}},
		{"auto is plaintext on 15010", []string{"-pod", "p"}, map[string]string{"DISCOVERY_ADDRESS": "istiod:15010"}, nil,
			func(t *testing.T, c Config) {
				if c.Upstream.Mode != ModePlaintext || c.NeedsSDS() {
					t.Fatalf("mode %s", c.Upstream.Mode)
				}
			}},
		{"auto is mtls elsewhere", []string{"-pod", "p"}, nil, nil,
			func(t *testing.T, c Config) {
				if c.Upstream.Mode != ModeMTLS || !c.NeedsSDS() || c.Upstream.Address != "istiod.istio-system.svc:15012" {
					t.Fatalf("mode %s address %s", c.Upstream.Mode, c.Upstream.Address)
				}
			}},
		// Istio's agent dials its discovery server in plaintext under
		// controlPlaneAuthPolicy NONE (pkg/istio-agent xds_proxy.go getTLSOptions),
		// with mutual TLS under MUTUAL_TLS, whatever the port.
		{"controlPlaneAuthPolicy NONE is plaintext", []string{"-pod", "p"},
			map[string]string{"PROXY_CONFIG": `{"discoveryAddress":"cp.example:15012","controlPlaneAuthPolicy":"NONE"}`}, nil,
			func(t *testing.T, c Config) {
				if c.Upstream.Mode != ModePlaintext || c.NeedsSDS() || c.Upstream.RootCA != "" {
					t.Fatalf("mode %s root %q", c.Upstream.Mode, c.Upstream.RootCA)
				}
			}},
		{"controlPlaneAuthPolicy MUTUAL_TLS is mtls on 15010 too", []string{"-pod", "p"},
			map[string]string{"PROXY_CONFIG": `controlPlaneAuthPolicy: MUTUAL_TLS`, "DISCOVERY_ADDRESS": "istiod:15010"}, nil,
			func(t *testing.T, c Config) {
				if c.Upstream.Mode != ModeMTLS {
					t.Fatalf("mode %s", c.Upstream.Mode)
				}
			}},
		{"XDS_TLS beats controlPlaneAuthPolicy", []string{"-pod", "p"},
			map[string]string{"PROXY_CONFIG": `{"controlPlaneAuthPolicy":0}`, "XDS_TLS": "mtls"}, nil,
			func(t *testing.T, c Config) {
				if c.Upstream.Mode != ModeMTLS {
					t.Fatalf("mode %s", c.Upstream.Mode)
				}
			}},
		{"tls with root file needs no sds", []string{"-pod", "p", "-xds-tls", "tls", "-xds-root-ca", "/ca.pem"}, nil, nil,
			func(t *testing.T, c Config) {
				if c.NeedsSDS() || c.Upstream.RootCA != "/ca.pem" {
					t.Fatalf("needs sds with a root file; root %s", c.Upstream.RootCA)
				}
			}},
		{"flags beat env; headers from environ", []string{"-pod", "p", "-cluster-id", "flag"},
			map[string]string{"CLUSTER_ID": "env", "POD_NAME": "q", "XDS_HEADER_FOO": "bar", "XDS_HEADER_ISTIO_VERSION": "1.31", "OTHER": "x"},
			[]string{"XDS_HEADER_FOO=bar", "XDS_HEADER_ISTIO_VERSION=1.31", "XDS_HEADER_GONE=x", "OTHER=x"},
			func(t *testing.T, c Config) {
				if c.Upstream.ClusterID != "flag" || c.Pod.ID != "p" {
					t.Fatalf("cluster id %s pod %s", c.Upstream.ClusterID, c.Pod.ID)
				}
				if len(c.Upstream.Headers) != 2 || c.Upstream.Headers["foo"] != "bar" || c.Upstream.Headers["istio_version"] != "1.31" {
					t.Fatalf("headers %v", c.Upstream.Headers)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := load(tt.args, testkit.Env(tt.env), tt.environ)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	_, err := load([]string{"-discovery-address", "nohost", "-xds-tls", "maybe", "-max-msg-size", "10",
		"-connect-timeout", "0s", "-log-level", "loud", "-socket", "/" + strings.Repeat("d", 95) + "/XDS"}, testkit.Env(map[string]string{"XDS_HEADER_BAD!": "x"}), []string{"XDS_HEADER_BAD!=x"})
	if err == nil {
		t.Fatal("want error")
	}
	for _, f := range []string{"-pod", "-discovery-address", "-xds-tls", "-max-msg-size", "-connect-timeout", "-log-level", "XDS_HEADER_BAD!", "-socket"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
}

// Load takes the XDS_HEADER_* names from the process environment and their values
// through getenv, as every other knob.
func TestLoadHeadersFromTheProcessEnvironment(t *testing.T) {
	t.Setenv("XDS_HEADER_TRACE_ID", "t-1")
	c, err := Load([]string{"-pod", "p"}, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream.Headers["trace_id"] != "t-1" {
		t.Fatalf("headers %v", c.Upstream.Headers)
	}
	if c, err = Load([]string{"-pod", "p"}, testkit.Env(nil)); err != nil || len(c.Upstream.Headers) != 0 {
		t.Fatalf("a getenv that knows no header gave %v (%v)", c.Upstream.Headers, err)
	}
}

func TestProcessNamesThePodOnEveryLogLine(t *testing.T) {
	c, err := Load([]string{"-pod", "web-0"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Process()
	if p.Name != "xds-relay" || p.Bus == nil || p.Bus.Name != "xds-relay/default/web-0" || p.HTTP != c.Listen.HTTP ||
		len(p.LogWith) != 2 || p.LogWith[0] != "pod" || p.LogWith[1] != "default/web-0" {
		t.Fatalf("process %+v", p)
	}
}

func TestDNSCaptureKnobs(t *testing.T) {
	c, err := Load([]string{"-pod", "p", "-pod-root", "/pods/p", "-dns-resolv-conf", "etc/resolv.conf"},
		testkit.Env(map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "DNS_PROXY_ADDR": "127.0.0.1:5353", "POD_NAMESPACE": "shop"}))
	if err != nil {
		t.Fatal(err)
	}
	if !c.DNS.Capture || c.DNS.Addr != "127.0.0.1:5353" || c.DNS.Namespace != "shop" || c.DNS.ResolvConf != "/pods/p/etc/resolv.conf" {
		t.Fatalf("dns %+v", c.DNS)
	}
	if c, err = Load([]string{"-pod", "p"}, testkit.Env(nil)); err != nil || c.DNS.Capture || c.DNS.Addr != "127.0.0.1:15053" || c.DNS.ResolvConf != "/etc/resolv.conf" {
		t.Fatalf("defaults %+v (%v)", c.DNS, err)
	}
	_, err = Load([]string{"-pod", "p", "-dns-capture", "-dns-addr", "nope", "-dns-resolv-conf", "", "-pod-namespace", ""}, testkit.Env(nil))
	for _, f := range []string{"-dns-addr", "-dns-resolv-conf", "-pod-namespace"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
}

// The debug tap is read as Istio's agent reads it: PROXY_XDS_DEBUG_VIA_AGENT
// (default true) and PROXY_XDS_DEBUG_VIA_AGENT_PORT (default 15004), from the
// container's env or PROXY_CONFIG's proxyMetadata, on localhost.
func TestDebugTapKnobs(t *testing.T) {
	c, err := Load([]string{"-pod", "p"}, testkit.Env(nil))
	if err != nil || !c.DebugTap.Enabled || c.DebugTapAddr() != "localhost:15004" {
		t.Fatalf("defaults %+v %s (%v)", c.DebugTap, c.DebugTapAddr(), err)
	}
	c, err = Load([]string{"-pod", "p"}, testkit.Env(map[string]string{"PROXY_XDS_DEBUG_VIA_AGENT_PORT": "25004"}))
	if err != nil || !c.DebugTap.Enabled || c.DebugTapAddr() != "localhost:25004" {
		t.Fatalf("port from the env: %+v (%v)", c.DebugTap, err)
	}
	c, err = Load([]string{"-pod", "p"}, testkit.Env(map[string]string{"PROXY_CONFIG": `{"proxyMetadata":{"PROXY_XDS_DEBUG_VIA_AGENT":"false"}}`}))
	if err != nil || c.DebugTap.Enabled {
		t.Fatalf("off through proxyMetadata: %+v (%v)", c.DebugTap, err)
	}
	if _, err := Load([]string{"-pod", "p", "-debug-tap-port", "0"}, testkit.Env(nil)); err == nil || !strings.Contains(err.Error(), "-debug-tap-port") {
		t.Fatalf("port 0: %v, want an error naming -debug-tap-port", err)
	}
	if _, err := Load([]string{"-pod", "p", "-debug-tap=false", "-debug-tap-port", "0"}, testkit.Env(nil)); err != nil {
		t.Fatalf("the port of a tap that is off: %v", err)
	}
}

// The workload health checks are read as Istio's agent reads them: ProxyConfig's
// readinessProbe (none: no checks), the workload's INSTANCE_IP, and Envoy's admin
// from proxyAdminPort (127.0.0.1:15000 by default), which -envoy-admin or
// ENVOY_ADMIN_ADDR overrides and an empty value leaves unprobed.
func TestHealthCheckKnobs(t *testing.T) {
	c, err := Load([]string{"-pod", "p"}, testkit.Env(nil))
	if err != nil || c.Health.Probe != nil || c.Health.EnvoyAdmin != "127.0.0.1:15000" {
		t.Fatalf("defaults %+v (%v)", c.Health, err)
	}
	pc := `{"proxyAdminPort":25000,"readinessProbe":{"httpGet":{"path":"/ready","port":8080},"periodSeconds":2}}`
	c, err = Load([]string{"-pod", "p"}, testkit.Env(map[string]string{"PROXY_CONFIG": pc, "INSTANCE_IP": "10.0.0.7,fd00::7"}))
	if err != nil || c.Health.Probe == nil || c.Health.Probe.HTTPGet.Port != 8080 || c.Health.Probe.PeriodSeconds != 2 ||
		c.Health.EnvoyAdmin != "127.0.0.1:25000" || strings.Join(c.Health.IPs, ",") != "10.0.0.7,fd00::7" {
		t.Fatalf("from PROXY_CONFIG: %+v (%v)", c.Health, err)
	}
	c, err = Load([]string{"-pod", "p", "-envoy-admin", ""}, testkit.Env(map[string]string{"PROXY_CONFIG": pc, "ENVOY_ADMIN_ADDR": "127.0.0.1:1"}))
	if err != nil || c.Health.EnvoyAdmin != "" {
		t.Fatalf("-envoy-admin empty: %+v (%v)", c.Health, err)
	}
	_, err = Load([]string{"-pod", "p", "-envoy-admin", "15000", "-instance-ip", "ten"}, testkit.Env(map[string]string{"PROXY_CONFIG": pc}))
	if err == nil || !strings.Contains(err.Error(), "-envoy-admin") || !strings.Contains(err.Error(), "-instance-ip") {
		t.Fatalf("bad knobs: %v, want errors naming -envoy-admin and -instance-ip", err)
	}
	_, err = Load([]string{"-pod", "p"}, testkit.Env(map[string]string{"PROXY_CONFIG": `{"readinessProbe":{"periodSeconds":2}}`}))
	if err == nil || !strings.Contains(err.Error(), "readinessProbe") {
		t.Fatalf("a probe with no method: %v", err)
	}
}

// The relay is its pod on the bus: namespace (POD_NAMESPACE) and name; a namespace
// that is no DNS label is refused, naming the flags.
func TestPodOnTheBusIsNamespaceAndName(t *testing.T) {
	c, err := Load([]string{"-pod", "web-0"}, testkit.Env(map[string]string{"POD_NAMESPACE": "shop"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.PodRef() != (events.PodRef{Namespace: "shop", Name: "web-0"}) || c.Bus.Pod != "shop/web-0" || c.Bus.InboxPrefix != "_INBOX.pod.shop.web-0" {
		t.Fatalf("pod %v, bus claim %q inbox %q", c.PodRef(), c.Bus.Pod, c.Bus.InboxPrefix)
	}
	for _, ns := range []string{"Shop", "sh.op", "sh_op", "*"} {
		if _, err := Load([]string{"-pod", "web-0", "-pod-namespace", ns}, testkit.Env(nil)); err == nil || !strings.Contains(err.Error(), "-pod/-pod-namespace") {
			t.Errorf("namespace %q: %v", ns, err)
		}
	}
}

// TestIstioProxyEnv: PROXY_CONFIG's discoveryAddress is the default address,
// PILOT_CERT_PROVIDER picks the upstream roots as Istio's agent does, and XDS_AUTH
// sends the pod's token when there is one (Istio's default) or none.
func TestIstioProxyEnv(t *testing.T) {
	root := t.TempDir()
	env := map[string]string{"POD_NAME": "web-0", "POD_ROOT": root,
		"PROXY_CONFIG": `{"discoveryAddress":"istiod.istio-system.svc:15012","proxyMetadata":{"XDS_CONNECT_TIMEOUT":"3s"}}`}
	getenv := func(k string) string { return env[k] }
	c, err := Load(nil, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream.Address != "istiod.istio-system.svc:15012" || c.Upstream.ConnectTimeout != 3*time.Second || c.Upstream.RootCA != "" || c.Upstream.TokenFile != "" {
		t.Fatalf("address %q timeout %s roots %q token %q", c.Upstream.Address, c.Upstream.ConnectTimeout, c.Upstream.RootCA, c.Upstream.TokenFile)
	}
	tok := filepath.Join(root, PodTokenFile)
	if err := os.MkdirAll(filepath.Dir(tok), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tok, []byte("jwt"), 0o600); err != nil {
		t.Fatal(err)
	}
	env["PILOT_CERT_PROVIDER"] = "kubernetes"
	env["DISCOVERY_ADDRESS"] = "other:15012"
	if c, err = Load(nil, getenv); err != nil {
		t.Fatal(err)
	}
	if c.Upstream.Address != "other:15012" || c.Upstream.TokenFile != tok || c.Upstream.RootCA != filepath.Join(root, "var/run/secrets/kubernetes.io/serviceaccount/ca.crt") {
		t.Fatalf("address %q token %q roots %q", c.Upstream.Address, c.Upstream.TokenFile, c.Upstream.RootCA)
	}
	env["XDS_AUTH"] = "false"
	if c, err = Load(nil, getenv); err != nil || c.Upstream.TokenFile != "" {
		t.Fatalf("XDS_AUTH=false: token %q, %v", c.Upstream.TokenFile, err)
	}
	if _, err = Load([]string{"-token-file", "t"}, getenv); err == nil || !strings.Contains(err.Error(), "XDS_AUTH") {
		t.Fatalf("XDS_AUTH=false with a token file: %v", err)
	}
	env["PILOT_CERT_PROVIDER"] = "vault"
	if _, err = Load(nil, getenv); err == nil || !strings.Contains(err.Error(), "-pilot-cert-provider") {
		t.Fatalf("PILOT_CERT_PROVIDER=vault: %v", err)
	}
	env["PILOT_CERT_PROVIDER"] = "custom"
	env["DISCOVERY_ADDRESS"] = "istiod:15010"
	delete(env, "XDS_AUTH")
	if c, err = Load(nil, getenv); err != nil || c.Upstream.RootCA != "" || c.Upstream.Mode != ModePlaintext || c.Upstream.TokenFile != "" {
		t.Fatalf("plaintext :15010 takes no roots and sends no token by itself: %q %s %q, %v", c.Upstream.RootCA, c.Upstream.Mode, c.Upstream.TokenFile, err)
	}
	env["PROXY_CONFIG"] = `{"discoveryAddress":1}`
	if _, err = Load(nil, getenv); err == nil || !strings.Contains(err.Error(), "PROXY_CONFIG") {
		t.Fatalf("bad PROXY_CONFIG: %v", err)
	}
}

// XDS_ROOT_CA is read as Istio's agent reads it (pkg/istio-agent,
// FindRootCAForXDS): SYSTEM or a file first; unset, a mounted
// ./etc/certs/root-cert.pem whenever it exists, whatever PILOT_CERT_PROVIDER
// says; else the provider's roots (istiod: the mesh roots from sds-edge).
func TestXDSRootCAAsIstiosAgentReadsIt(t *testing.T) {
	root := t.TempDir()
	mounted := filepath.Join(root, MountedRootCert)
	for _, tc := range []struct {
		name    string
		env     map[string]string
		mounted bool
		want    string
	}{
		{name: "SYSTEM", env: map[string]string{"XDS_ROOT_CA": "SYSTEM"}, mounted: true, want: "SYSTEM"},
		{name: "a file before the mounted root", env: map[string]string{"XDS_ROOT_CA": "etc/xds/ca.pem"}, mounted: true, want: filepath.Join(root, "etc/xds/ca.pem")},
		{name: "the mounted root before the provider's", env: map[string]string{"PILOT_CERT_PROVIDER": "kubernetes"}, mounted: true, want: mounted},
		{name: "istiod, nothing mounted: sds-edge's roots", env: map[string]string{}, want: ""},
		{name: "kubernetes, nothing mounted", env: map[string]string{"PILOT_CERT_PROVIDER": "kubernetes"}, want: filepath.Join(root, "var/run/secrets/kubernetes.io/serviceaccount/ca.crt")},
		{name: "plaintext: none", env: map[string]string{"DISCOVERY_ADDRESS": "istiod:15010"}, mounted: true, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.Remove(mounted)
			if tc.mounted {
				if err := os.MkdirAll(filepath.Dir(mounted), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(mounted, []byte("roots"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			tc.env["POD_NAME"], tc.env["POD_ROOT"] = "web-0", root
			c, err := Load(nil, func(k string) string { return tc.env[k] })
			if err != nil || c.Upstream.RootCA != tc.want {
				t.Fatalf("roots %q, %v; want %q", c.Upstream.RootCA, err, tc.want)
			}
		})
	}
}
