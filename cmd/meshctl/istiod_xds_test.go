//go:build istio

package main

// Against Istio's real istiod (tests/istiotest, make test-istio): meshagent's pod
// agent with istiod as its discovery server, through xds-relay, configured by
// Istio's injection-template environment.

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/istiotest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// sidecarEnv is the fixture's sidecar env and args (cmd/meshagent/testdata),
// without the named signer: istiod's own CA has none (it signs with its root
// whatever ISTIO_META_CERT_SIGNER says), so the template's mesh asks for none.
func sidecarEnv(t *testing.T) (args []string, env map[string]string) {
	t.Helper()
	var fixture map[string]json.RawMessage
	var in struct {
		Args []string          `json:"args"`
		Env  map[string]string `json:"env"`
	}
	data, err := os.ReadFile("../meshagent/testdata/istio-injected.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &fixture); err != nil || json.Unmarshal(fixture["sidecar"], &in) != nil {
		t.Fatalf("the fixture: %v", err)
	}
	delete(in.Env, "ISTIO_META_CERT_SIGNER")
	in.Env["PROXY_CONFIG"] = strings.Replace(in.Env["PROXY_CONFIG"], `"ISTIO_META_CERT_SIGNER":"partner",`, "", 1)
	if strings.Contains(in.Env["PROXY_CONFIG"], "CERT_SIGNER") {
		t.Fatalf("the fixture's PROXY_CONFIG changed: %s", in.Env["PROXY_CONFIG"])
	}
	return in.Args, in.Env
}

// TestIstiodAsTheDiscoveryServer: one `meshagent pod` process with the
// injection template's env and args (the fixture's pod shop/web-7d4f9 at
// 10.244.1.17, whose Pod object the test creates and whose status it writes as a
// kubelet would) takes its certificate from istiod and its configuration from
// istiod's 15012 over mutual TLS, through xds-relay:
//   - the Envoy stand-in gets istiod's clusters and listeners (the Service the
//     test created among them), and its status port turns ready;
//   - istiod's /debug/syncz shows the pod connected, every push acknowledged;
//   - the pod's debug tap (PROXY_XDS_DEBUG_VIA_AGENT) answers istio.io/debug/syncz
//     and config_dump as istiod's own debug port does (checkDebugTap);
//   - NDS fills the relay's DNS proxy: the Service's name resolves to its cluster
//     IP, a Service created later resolves too, and a name no Service has does not;
//   - istiod's ProxyConfig (PCDS, ISTIO_MULTIROOT_MESH) is applied: the extra root
//     of the mesh config's caCertificates reaches the pod's ROOTCA, which istiod's
//     istio-ca-root-cert (the pod's mounted root) does not hold.
func TestIstiodAsTheDiscoveryServer(t *testing.T) {
	meshagent := filepath.Join(binDir, "meshagent") // TestMain built it
	args, env := sidecarEnv(t)
	ns, sa, pod, ip := env["POD_NAMESPACE"], env["SERVICE_ACCOUNT"], env["POD_NAME"], env["INSTANCE_IP"]
	extra := testkit.SelfSigned(t, testkit.Spec{Name: "mesh-extra-root", IsCA: true, Life: 24 * time.Hour})
	mesh := "caCertificates:\n- pem: |\n    " + strings.ReplaceAll(strings.TrimSpace(extra.PEM()), "\n", "\n    ") + "\n"

	kube := kubetest.Start(t)
	d := istiotest.Start(t, kube, istiotest.Config{Mesh: mesh, Env: []string{"ISTIO_MULTIROOT_MESH=true"}})
	kube.Admin.Namespace(t, ns, nil)
	kube.Admin.ServiceAccount(t, ns, sa)
	uid := istiotest.Pod(t, kube, ns, pod, sa, ip, map[string]string{"app": "web"})
	webIP := istiotest.Service(t, kube, ns, "web", map[string]string{"app": "web"})
	rootPEM, istioRoots := d.RootCert(t, ns)
	if strings.Contains(rootPEM, strings.TrimSpace(extra.PEM())) {
		t.Fatal("istio-ca-root-cert holds the mesh config's extra root: ROOTCA could not tell PCDS applied")
	}
	root := istiodPod(t, kube.Admin.RequestToken(t, ns, sa, "istio-ca", pod, uid, 3600), rootPEM)
	resolvConf := filepath.Join(root, "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bus := bustest.Server(t)

	sdsHTTP, relayHTTP, status, dnsAddr, tapAddr := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	_, tapPort, _ := net.SplitHostPort(tapAddr)
	cmd := exec.Command(meshagent, slices.Concat([]string{"pod",
		"--sds-edge", "-http-addr", sdsHTTP,
		"--xds-relay", "-http-addr", relayHTTP, "-dns-addr", dnsAddr, "-debug-tap-port", tapPort, "-discovery-address", d.SecureAddr,
		"--launcher"}, args, []string{"-http-addr", testkit.FreeAddr(t), "-status-addr", status, "-envoy-admin", testkit.FreeAddr(t),
		"-envoy-stats-addr", testkit.FreeAddr(t), "-relay-ready-url", "http://" + relayHTTP + "/readyz",
		"-sds-ready-url", "http://" + sdsHTTP + "/readyz", "-envoy-binary", filepath.Join(binDir, "envoy-standin")})...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "POD_ROOT="+root, "NATS_URL="+bus.ClientURL(), "CA_ADDR="+d.SecureAddr, "DNS_RESOLV_CONF="+resolvConf)
	logs := &testkit.Buffer{}
	testkit.Launch(t, cmd, logs, "meshagent pod")

	testkit.EventuallyWithin(t, 90*time.Second, "the pod's status port ready (Envoy started with istiod's config)", func() bool {
		code, _ := testkit.HTTPGet("http://" + status + "/healthz/ready")
		return code == http.StatusOK
	})
	testkit.EventuallyWithin(t, 30*time.Second, "istiod's clusters and listeners at the Envoy stand-in", func() bool {
		out := logs.String()
		return strings.Contains(out, "outbound|80||web."+ns+".svc.cluster.local") && strings.Contains(out, "BlackHoleCluster") &&
			strings.Contains(out, "ads Listener") && strings.Contains(out, "virtualOutbound")
	})
	checkSyncz(t, d, pod+"."+ns)
	checkDebugTap(t, d, tapAddr, pod+"."+ns, ns, "outbound|80||web."+ns+".svc.cluster.local")
	checkNDS(t, kube, ns, dnsAddr, webIP)

	// PCDS: the mesh config's extra root reaches the pod's ROOTCA beside istiod's.
	testkit.EventuallyWithin(t, 30*time.Second, "istiod's ProxyConfig trust bundle in ROOTCA", func() bool {
		roots := rootCA(t, filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"), "sidecar~"+ip+"~"+pod+"."+ns+"~"+ns+".svc.cluster.local")
		return slices.ContainsFunc(roots, extra.Cert.Equal) && slices.ContainsFunc(roots, istioRoots[0].Equal)
	})
}

// checkSyncz waits until istiod's /debug/syncz shows the proxy name (istiod's
// id: pod.namespace) connected and in sync, and checks what istiod knows of it.
func checkSyncz(t *testing.T, d *istiotest.Istiod, name string) {
	t.Helper()
	var st istiotest.SyncStatus
	if !testkit.Poll(30*time.Second, func() bool {
		for _, s := range d.Syncz(t) {
			if s.ProxyID == name {
				st = s
				return s.InSync()
			}
		}
		return false
	}) {
		t.Fatalf("istiod's /debug/syncz does not show %s in sync after 30s: %s", name, st)
	}
	t.Logf("istiod /debug/syncz: %s", st)
	if st.ClusterID != "Kubernetes" || st.ProxyType != "sidecar" {
		t.Errorf("istiod sees cluster %q, type %q, want Kubernetes, sidecar", st.ClusterID, st.ProxyType)
	}
}

// checkNDS: the relay's DNS proxy answers the Service's name with its cluster IP
// (the short name too: the pod's namespace is a search domain), a Service created
// now resolves once istiod pushes it, and a name no Service has does not.
func checkNDS(t *testing.T, kube *kubetest.Server, ns, dnsAddr, webIP string) {
	t.Helper()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", dnsAddr)
	}}
	lookup := func(name string) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return r.LookupHost(ctx, name)
	}
	testkit.EventuallyWithin(t, 30*time.Second, "web."+ns+" resolving to "+webIP+" through NDS", func() bool {
		got, err := lookup("web." + ns + ".svc.cluster.local")
		return err == nil && slices.Equal(got, []string{webIP})
	})
	lateIP := istiotest.Service(t, kube, ns, "late", map[string]string{"app": "late"})
	testkit.EventuallyWithin(t, 30*time.Second, "a Service created later resolving through NDS", func() bool {
		got, err := lookup("late." + ns + ".svc.cluster.local")
		return err == nil && slices.Equal(got, []string{lateIP})
	})
	if got, err := lookup("nope." + ns + ".svc.cluster.local"); err == nil {
		t.Errorf("a name no Service has resolved to %v", got)
	}
}

// rootCA fetches ROOTCA from the pod's SDS socket (none on failure, to poll).
func rootCA(t *testing.T, socket, node string) []*x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := sdsclient.DialUnix(ctx, socket)
	if err != nil {
		return nil
	}
	defer cc.Close()
	got, err := sdsclient.Fetch(ctx, cc, node, "ROOTCA")
	if err != nil {
		return nil
	}
	roots, _ := pki.ParseCertsPEM(got["ROOTCA"].TrustedCA)
	return roots
}
