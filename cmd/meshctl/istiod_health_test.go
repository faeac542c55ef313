//go:build istio

package main

// Against Istio's real istiod (tests/istiotest, make test-istio): a VM-style
// workload that auto-registers (ISTIO_META_AUTO_REGISTER_GROUP) gets a
// WorkloadEntry from istiod, whose Healthy condition follows the app's readiness
// as meshagent's xds-relay probes it (Istio's workload health checks); and the
// node's ISTIO_VERSION reaches istiod.

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/istiotest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// vmApp is the VM's application: an HTTP server on the VM's address whose
// /ready answers 200, which the test stops and starts again.
type vmApp struct {
	t    *testing.T
	addr string
	mu   sync.Mutex
	srv  *http.Server
}

func startVMApp(t *testing.T, ip string) *vmApp {
	t.Helper()
	a := &vmApp{t: t, addr: net.JoinHostPort(ip, "0")}
	a.start()
	t.Cleanup(a.stop)
	return a
}

func (a *vmApp) start() {
	a.t.Helper()
	ln, err := net.Listen("tcp", a.addr)
	if err != nil {
		a.t.Fatalf("the app on %s: %v", a.addr, err)
	}
	a.addr = ln.Addr().String() // the same port when it starts again
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" {
			http.NotFound(w, r)
		}
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	a.mu.Lock()
	a.srv = srv
	a.mu.Unlock()
}

func (a *vmApp) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv != nil {
		_ = a.srv.Close()
		a.srv = nil
	}
}

func (a *vmApp) port() int {
	_, p, _ := net.SplitHostPort(a.addr)
	n, _ := strconv.Atoi(p)
	return n
}

// vmPod is one `meshagent pod` run as a VM's agent.
type vmPod struct {
	logs   *testkit.Buffer
	status string
}

// startVMPod runs `meshagent pod` (`proxy sidecar`, as on a VM) for the VM
// name at ip in namespace ns as service account sa, with the environment
// `istioctl x workload entry configure` writes for a VM of WorkloadGroup group
// (cluster.env's variables; mesh.yaml's defaultConfig as PROXY_CONFIG, with
// pc's fields over it), its token an unbound TokenRequest token (audience
// istio-ca) and istiod's root mounted, as that command leaves them.
func startVMPod(t *testing.T, d *istiotest.Istiod, bus, ns, sa, group, name, ip, rootPEM string, pc map[string]any, env ...string) *vmPod {
	t.Helper()
	root := istiodPod(t, d.Kube.Admin.RequestToken(t, ns, sa, "istio-ca", "", "", 3600), rootPEM)
	_, adminPortS, _ := net.SplitHostPort(testkit.FreeAddr(t))
	adminPort, _ := strconv.Atoi(adminPortS) // Envoy's admin, which the relay probes first
	proxyConfig := map[string]any{"discoveryAddress": d.SecureAddr, "proxyAdminPort": adminPort, "meshId": "cluster.local"}
	for k, v := range pc {
		proxyConfig[k] = v
	}
	pcJSON, err := json.Marshal(proxyConfig)
	if err != nil {
		t.Fatal(err)
	}
	p := &vmPod{logs: &testkit.Buffer{}, status: testkit.FreeAddr(t)}
	sdsHTTP, relayHTTP := testkit.FreeAddr(t), testkit.FreeAddr(t)
	cmd := exec.Command(filepath.Join(binDir, "meshagent"), "pod",
		"--sds-edge", "-http-addr", sdsHTTP,
		"--xds-relay", "-http-addr", relayHTTP,
		"--launcher", "proxy", "sidecar", "--domain", ns+".svc.cluster.local",
		"-http-addr", testkit.FreeAddr(t), "-status-addr", p.status, "-envoy-stats-addr", testkit.FreeAddr(t),
		"-relay-ready-url", "http://"+relayHTTP+"/readyz", "-sds-ready-url", "http://"+sdsHTTP+"/readyz",
		"-envoy-binary", filepath.Join(binDir, "envoy-standin"))
	cmd.Env = append(os.Environ(),
		"POD_ROOT="+root, "NATS_URL="+bus, "CA_ADDR="+d.SecureAddr, "PILOT_CERT_PROVIDER=istiod",
		"POD_NAME="+name, "POD_NAMESPACE="+ns, "SERVICE_ACCOUNT="+sa, "TRUST_DOMAIN=cluster.local", "INSTANCE_IP="+ip,
		"ISTIO_META_AUTO_REGISTER_GROUP="+group, "ISTIO_META_CLUSTER_ID=Kubernetes", "ISTIO_META_WORKLOAD_NAME="+group,
		`ISTIO_METAJSON_LABELS={"app":"`+group+`"}`, "ISTIO_META_MESH_ID=cluster.local",
		"PROXY_CONFIG="+string(pcJSON), "PROXY_XDS_DEBUG_VIA_AGENT=false")
	cmd.Env = append(cmd.Env, env...)
	testkit.Launch(t, cmd, p.logs, "meshagent pod "+name)
	testkit.EventuallyWithin(t, 90*time.Second, name+"'s status port ready (Envoy started with istiod's config)", func() bool {
		code, _ := testkit.HTTPGet("http://" + p.status + "/healthz/ready")
		return code == http.StatusOK
	})
	return p
}

// TestIstiodWorkloadEntryHealthFollowsTheApp: istiod with an Istio VM install's
// settings (istiotest.VMEnv) and a WorkloadGroup web (with a probe) in namespace
// vm. A VM's `meshagent pod` with ISTIO_META_AUTO_REGISTER_GROUP=web and the
// group's probe as its readinessProbe connects to istiod's 15012 with the
// certificate istiod issued it:
//   - istiod creates the WorkloadEntry web-<ip> for it, from the group, with
//     health checking enabled;
//   - the entry's Healthy condition follows the app both ways: ready → True,
//     app stopped → False with the probe's message, started again → True;
//   - Envoy (the stand-in) never sees a HealthInformation message;
//   - positive control: a second VM of the group whose ProxyConfig has no
//     readinessProbe is registered too, but without health checking, and its
//     entry gets no Healthy condition while the first one's changes three times;
//   - ISTIO_VERSION: istiod's /debug/syncz shows the first VM's version as the
//     launcher's default (the istio.io/api release, 1.31.1) and the second's as its
//     ISTIO_META_ISTIO_VERSION, and istiod never logs the version missing for them.
func TestIstiodWorkloadEntryHealthFollowsTheApp(t *testing.T) {
	const ns, sa, group = "vm", "vm-web", "web"
	const ip1, ip2 = "127.0.0.17", "127.0.0.18" // the VMs' addresses; the app listens on the first
	kube := kubetest.Start(t)
	d := istiotest.Start(t, kube, istiotest.Config{Env: istiotest.VMEnv})
	kube.Admin.Namespace(t, ns, nil)
	kube.Admin.ServiceAccount(t, ns, sa)
	app := startVMApp(t, ip1)
	probe := map[string]any{"httpGet": map[string]any{"path": "/ready", "port": app.port()}, "periodSeconds": 1,
		"timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 1}
	istiotest.WorkloadGroup(t, kube, ns, group, sa, map[string]string{"app": group}, probe)
	rootPEM, _ := d.RootCert(t, ns)
	bus := bustest.Server(t).ClientURL()

	vm1 := startVMPod(t, d, bus, ns, sa, group, "web-vm-1", ip1, rootPEM, map[string]any{"readinessProbe": probe})
	vm2 := startVMPod(t, d, bus, ns, sa, group, "web-vm-2", ip2, rootPEM, nil, "ISTIO_META_ISTIO_VERSION=1.30.2")

	entry1, entry2 := group+"-"+ip1, group+"-"+ip2
	var e istiotest.WorkloadEntry
	testkit.EventuallyWithin(t, 30*time.Second, "istiod's WorkloadEntry "+entry1, func() bool {
		var ok bool
		e, ok = istiotest.GetWorkloadEntry(t, kube, ns, entry1)
		return ok
	})
	t.Logf("istiod: %s", istiotest.LogLine(d.Logs.String(), "auto-registered WorkloadEntry "+ns+"/"+entry1))
	if e.Spec.Address != ip1 || e.Spec.ServiceAccount != sa || e.Metadata.Annotations["istio.io/autoRegistrationGroup"] != group ||
		e.Metadata.Annotations["proxy.istio.io/health-checks-enabled"] != "true" || e.Spec.Labels["app"] != group {
		t.Fatalf("WorkloadEntry %s: %+v", entry1, e)
	}

	healthy := func(want string) (msg string) {
		t.Helper()
		testkit.EventuallyWithin(t, 30*time.Second, entry1+" Healthy="+want, func() bool {
			e, ok := istiotest.GetWorkloadEntry(t, kube, ns, entry1)
			if !ok {
				return false
			}
			status, m, ok := e.Healthy()
			msg = m
			return ok && status == want
		})
		t.Logf("WorkloadEntry %s: Healthy=%s %q", entry1, want, msg)
		return msg
	}
	healthy("True")
	app.stop()
	if msg := healthy("False"); !strings.Contains(msg, "connection refused") {
		t.Errorf("Healthy=False with message %q, want the probe's error (connection refused)", msg)
	}
	app.start()
	healthy("True")

	// The control: registered by the same istiod, no health checking, no condition.
	e2, ok := istiotest.GetWorkloadEntry(t, kube, ns, entry2)
	if !ok {
		t.Fatalf("no WorkloadEntry %s for the VM without a readinessProbe (entries: %v)", entry2, istiotest.WorkloadEntryNames(t, kube, ns))
	}
	if _, set := e2.Metadata.Annotations["proxy.istio.io/health-checks-enabled"]; set {
		t.Errorf("%s has health checking enabled without a readinessProbe: %v", entry2, e2.Metadata.Annotations)
	}
	if status, msg, ok := e2.Healthy(); ok {
		t.Errorf("%s, whose agent reports no health, has Healthy=%s %q", entry2, status, msg)
	}

	for _, p := range []*vmPod{vm1, vm2} {
		if out := p.logs.String(); strings.Contains(out, "HealthInformation") {
			t.Errorf("Envoy saw a HealthInformation message:\n%s", out)
		}
	}

	// ISTIO_VERSION, as istiod shows it.
	want := map[string]string{"web-vm-1." + ns: launcherIstioVersion(t), "web-vm-2." + ns: "1.30.2"}
	got := map[string]string{}
	testkit.EventuallyWithin(t, 30*time.Second, "both VMs in istiod's /debug/syncz", func() bool {
		for _, s := range d.Syncz(t) {
			if _, ok := want[s.ProxyID]; ok {
				got[s.ProxyID] = s.IstioVersion
			}
		}
		return len(got) == len(want)
	})
	for id, v := range want {
		if got[id] != v {
			t.Errorf("istiod's /debug/syncz: %s istio_version %q, want %q", id, got[id], v)
		}
		if line := istiotest.LogLine(d.Logs.String(), "Istio Version is not found in metadata for "+id); line != "" {
			t.Errorf("istiod: %s", line)
		}
	}
	t.Logf("istiod /debug/syncz istio_version: %v", got)
}

// launcherIstioVersion is the launcher's default ISTIO_VERSION: the istio.io/api
// release the repository builds against (its unit test holds it to pkg's go.mod),
// read here from this binary's own build of that module.
func launcherIstioVersion(t *testing.T) string {
	t.Helper()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "istio.io/api" {
				return strings.TrimPrefix(m.Version, "v")
			}
		}
	}
	t.Fatal("this test binary does not link istio.io/api")
	return ""
}
