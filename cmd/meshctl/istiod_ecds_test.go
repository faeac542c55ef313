//go:build istio

package main

// Against Istio's real istiod (tests/istiotest, make test-istio): a WasmPlugin
// in the API server reaches the pod's Envoy through xds-relay as ECDS, its
// remote module downloaded, checked and cached by the relay (internal/wasm).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/istiotest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

const (
	listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	ecdsType     = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
)

// TestIstiodWasmPluginThroughTheRelay: one `meshagent pod` with istiod as its
// discovery server, and an Envoy stand-in on the pod's ADS socket that does
// what Envoy does with ECDS: it follows istiod's listeners to the extension
// configs their HTTP filters name and subscribes to them.
//   - a WasmPlugin with an http URL and the module's sha256: istiod names it in
//     LDS and serves it by ECDS as a remote load; the stand-in gets it pointing
//     at a file under the pod's /var/lib/istio/data holding exactly the module
//     (its sha256 matches), downloaded once;
//   - a WasmPlugin with a wrong sha256 (failing closed, as by default) gets
//     Istio's deny-all RBAC filter, one failing open the allow-all one, and the
//     cache holds only the good module though both bad ones were downloaded.
func TestIstiodWasmPluginThroughTheRelay(t *testing.T) {
	module := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	other := append(slices.Clone(module), 0x00)
	var mu sync.Mutex
	hits := map[string]int{}
	ms := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		switch r.URL.Path {
		case "/good.wasm":
			_, _ = w.Write(module)
		case "/other.wasm":
			_, _ = w.Write(other)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ms.Close)
	hitsOf := func(p string) int { mu.Lock(); defer mu.Unlock(); return hits[p] }

	kube := kubetest.Start(t)
	d := istiotest.Start(t, kube, istiotest.Config{})
	root, logs := startIstiodMeshPod(t, kube, d)
	_, env := sidecarEnv(t)
	ns := env["POD_NAMESPACE"]
	plugin := func(name, url, sum, fail string) string {
		spec := map[string]any{"url": url, "sha256": sum, "selector": map[string]any{"matchLabels": map[string]any{"app": "web"}}}
		if fail != "" {
			spec["failStrategy"] = fail
		}
		kube.Admin.Create(t, "/apis/extensions.istio.io/v1alpha1/namespaces/"+ns+"/wasmplugins", map[string]any{
			"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin", "metadata": kubetest.Meta{Name: name}, "spec": spec})
		return name
	}
	plugin("stats", ms.URL+"/good.wasm", sha256hex(module), "")

	testkit.EventuallyWithin(t, 90*time.Second, "the relay's ADS socket and Envoy's bootstrap", func() bool {
		_, err := os.Stat(filepath.Join(root, "etc/istio/proxy/envoy-rev.json"))
		return err == nil && strings.Contains(logs.String(), "ads Listener")
	})
	envoy := newEnvoyECDS(t, root)

	good := envoy.waitConfig(t, 60*time.Second, "stats")
	p := wasmFile(t, good)
	data, err := os.ReadFile(p)
	if err != nil || sha256hex(data) != sha256hex(module) || !strings.HasPrefix(p, filepath.Join(root, "var/lib/istio/data")+"/") {
		t.Fatalf("istiod's ECDS for stats loads %s (sha256 %s, %v): want the module (%s) in the pod's wasm cache",
			p, sha256hex(data), err, sha256hex(module))
	}
	t.Logf("istiod's ECDS %s reached the stand-in loading %s (sha256 %s)", good.GetName(), p, sha256hex(data))
	if n := hitsOf("/good.wasm"); n != 1 {
		t.Fatalf("module downloaded %d times, want once", n)
	}

	plugin("closed", ms.URL+"/other.wasm", sha256hex(module), "")
	plugin("open", ms.URL+"/other.wasm", sha256hex(module), "FAIL_OPEN")
	for _, tc := range []struct {
		name   string
		prefix string
		denies bool
	}{{"closed", "wasm-default-deny", true}, {"open", "wasm-default-allow", false}} {
		ec := envoy.waitConfig(t, 60*time.Second, tc.name)
		rb := &httprbac.RBAC{}
		if err := ec.GetTypedConfig().UnmarshalTo(rb); err != nil {
			t.Fatalf("%s with a wrong sha256 reached the stand-in as %s, want the RBAC fallback: %v", tc.name, ec.GetTypedConfig().GetTypeUrl(), err)
		}
		if (rb.GetRules() != nil) != tc.denies || rb.GetRulesStatPrefix() != tc.prefix {
			t.Fatalf("%s: RBAC %v, want denies=%v, stat prefix %s", tc.name, rb, tc.denies, tc.prefix)
		}
		t.Logf("istiod's ECDS %s with a wrong sha256 reached the stand-in as RBAC %s", ec.GetName(), tc.prefix)
	}
	if hitsOf("/other.wasm") == 0 {
		t.Fatal("the wrong module was never downloaded: its rejection proves nothing")
	}
	var cached []string
	_ = filepath.WalkDir(filepath.Join(root, "var/lib/istio/data"), func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() {
			cached = append(cached, p)
		}
		return err
	})
	if len(cached) != 1 || cached[0] != p {
		t.Fatalf("the pod's wasm cache holds %v, want the good module alone", cached)
	}
	if n := hitsOf("/good.wasm"); n != 1 {
		t.Fatalf("good module downloaded %d times over istiod's pushes, want once (cached)", n)
	}
}

func sha256hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// startIstiodMeshPod runs `meshagent pod` (sds-edge, xds-relay, launcher with
// the Envoy stand-in) for the fixture's pod against istiod, as
// TestIstiodAsTheDiscoveryServer does, and returns its root and logs.
func startIstiodMeshPod(t *testing.T, kube *kubetest.Server, d *istiotest.Istiod) (string, *testkit.Buffer) {
	t.Helper()
	args, env := sidecarEnv(t)
	ns, sa, pod, ip := env["POD_NAMESPACE"], env["SERVICE_ACCOUNT"], env["POD_NAME"], env["INSTANCE_IP"]
	kube.Admin.Namespace(t, ns, nil)
	kube.Admin.ServiceAccount(t, ns, sa)
	uid := istiotest.Pod(t, kube, ns, pod, sa, ip, map[string]string{"app": "web"})
	istiotest.Service(t, kube, ns, "web", map[string]string{"app": "web"})
	rootPEM, _ := d.RootCert(t, ns)
	root := istiodPod(t, kube.Admin.RequestToken(t, ns, sa, "istio-ca", pod, uid, 3600), rootPEM)
	bus := bustest.Server(t)
	sdsHTTP, relayHTTP := testkit.FreeAddr(t), testkit.FreeAddr(t)
	cmd := exec.Command(filepath.Join(binDir, "meshagent"), slices.Concat([]string{"pod",
		"--sds-edge", "-http-addr", sdsHTTP,
		"--xds-relay", "-http-addr", relayHTTP, "-debug-tap=false", "-discovery-address", d.SecureAddr,
		"--launcher"}, args, []string{"-status-addr", testkit.FreeAddr(t), "-envoy-admin", testkit.FreeAddr(t),
		"-envoy-stats-addr", testkit.FreeAddr(t), "-relay-ready-url", "http://" + relayHTTP + "/readyz",
		"-sds-ready-url", "http://" + sdsHTTP + "/readyz", "-envoy-binary", filepath.Join(binDir, "envoy-standin")})...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "POD_ROOT="+root, "NATS_URL="+bus.ClientURL(), "CA_ADDR="+d.SecureAddr)
	logs := &testkit.Buffer{}
	testkit.Launch(t, cmd, logs, "meshagent pod")
	return root, logs
}

// envoyECDS is the Envoy stand-in's ECDS side: an ADS stream on the pod's
// socket with the node of Envoy's bootstrap, subscribed to the listeners and
// to every extension config their HTTP filters discover, ACKing each response.
type envoyECDS struct {
	mu      sync.Mutex
	configs map[string]*corev3.TypedExtensionConfig // by plugin name (ns.name~...)
}

func newEnvoyECDS(t *testing.T, root string) *envoyECDS {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "etc/istio/proxy/envoy-rev.json"))
	if err != nil {
		t.Fatal(err)
	}
	var boot struct {
		Node json.RawMessage `json:"node"`
	}
	node := &corev3.Node{}
	if err := json.Unmarshal(raw, &boot); err != nil || (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(boot.Node, node) != nil {
		t.Fatalf("envoy-rev.json's node: %v", err)
	}
	cc, err := grpc.NewClient("unix://"+filepath.Join(root, "etc/istio/proxy/XDS"), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &envoyECDS{configs: map[string]*corev3.TypedExtensionConfig{}}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done; cc.Close() })
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: listenerType}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		var names []string
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}
			switch r.GetTypeUrl() {
			case listenerType:
				found := discoveredExtensions(r)
				if !slices.Equal(found, names) {
					names = found
					_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: ecdsType, ResourceNames: names})
				}
			case ecdsType:
				ack.ResourceNames = names
				e.mu.Lock()
				for _, a := range r.GetResources() {
					ec := &corev3.TypedExtensionConfig{}
					if a.UnmarshalTo(ec) == nil {
						e.configs[ec.GetName()] = ec
					}
				}
				e.mu.Unlock()
			}
			_ = st.Send(ack)
		}
	}()
	return e
}

// discoveredExtensions are the names of the extension configs the listeners'
// HTTP filters load by ECDS (config_discovery), sorted.
func discoveredExtensions(r *discoveryv3.DiscoveryResponse) []string {
	var out []string
	for _, a := range r.GetResources() {
		l := &listenerv3.Listener{}
		if a.UnmarshalTo(l) != nil {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					if hf.GetConfigDiscovery() != nil && !slices.Contains(out, hf.GetName()) {
						out = append(out, hf.GetName())
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// waitConfig waits for the extension config of WasmPlugin plugin (istiod names
// it extensions.istio.io/trafficextension/<ns>.<plugin>~istio-translated-wasmplugin).
func (e *envoyECDS) waitConfig(t *testing.T, within time.Duration, plugin string) *corev3.TypedExtensionConfig {
	t.Helper()
	var got *corev3.TypedExtensionConfig
	testkit.EventuallyWithin(t, within, "istiod's ECDS for WasmPlugin "+plugin+" at the stand-in", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for n, ec := range e.configs {
			if strings.Contains(n, "."+plugin+"~") || strings.HasSuffix(n, "."+plugin) {
				got = ec
				return true
			}
		}
		return false
	})
	return got
}

// wasmFile is the file ec's Wasm VM loads, failing if it loads anything else.
func wasmFile(t *testing.T, ec *corev3.TypedExtensionConfig) string {
	t.Helper()
	f := &httpwasm.Wasm{}
	if err := ec.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatalf("%s is %s, not a Wasm filter: %v", ec.GetName(), ec.GetTypedConfig().GetTypeUrl(), err)
	}
	p := f.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename()
	if p == "" {
		t.Fatalf("%s still loads %v", ec.GetName(), f.GetConfig().GetVmConfig().GetCode())
	}
	return p
}
