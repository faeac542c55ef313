package relay_test

// ECDS's Wasm remote load through the relay (internal/wasm), against a real
// go-control-plane ADS server and a real HTTP server holding the modules.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/services/xds-relay/internal/wasm"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// module is a valid (empty) Wasm module: the magic and version 1.
var module = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// moduleServer is a real HTTP server of modules that counts the requests per path.
type moduleServer struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func startModuleServer(t *testing.T, files map[string][]byte) *moduleServer {
	m := &moduleServer{hits: map[string]int{}}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.hits[r.URL.Path]++
		m.mu.Unlock()
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *moduleServer) hitsOf(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hits[path]
}

// deadURL is an http URL nobody listens on (a port just closed).
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/gone.wasm"
}

// wasmPlugin is the extension config istiod builds for a WasmPlugin with an
// http URL (pilot/pkg/model/extensions.go): a remote load with a 30 s timeout
// and the agent's ISTIO_META_* variables in the VM's environment.
func wasmPlugin(t *testing.T, name, url, sum string, policy wasmv3.FailurePolicy, rootID string) *corev3.TypedExtensionConfig {
	t.Helper()
	cfg, err := anypb.New(wrapperspb.String(`{"root":"` + rootID + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	f := &httpwasm.Wasm{Config: &wasmv3.PluginConfig{Name: name, RootId: rootID, Configuration: cfg, FailurePolicy: policy,
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{Runtime: "envoy.wasm.runtime.v8",
			Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
				HttpUri: &corev3.HttpUri{Uri: url, Timeout: durationpb.New(30 * time.Second),
					HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: "_"}},
				Sha256: sum}}},
			EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: map[string]string{
				"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1", "GREETING": "hello"}}}}}}
	tc, err := anypb.New(f)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TypedExtensionConfig{Name: name, TypedConfig: tc}
}

// startWasmRelay runs a relay whose only extra is the Wasm rewrite over a
// cache in dir (one download attempt each, so a dead URL fails at once).
func startWasmRelay(t *testing.T, upAddr, dir string) string {
	t.Helper()
	log := testLog(t)
	d, err := upstream.New(upstream.Config{Address: upAddr, Mode: upstream.Plaintext, MaxMsgSize: 64 << 20,
		ConnectTimeout: 2 * time.Second}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	opts := wasm.DefaultOptions(dir)
	opts.MaxAttempts = 1
	c, err := wasm.NewCache(opts, clock.Real{}, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(testkit.ShortDir(t), "XDS")
	srv, err := relay.New(relay.Config{Pod: testPodRef, Socket: socket, MaxMsgSize: 64 << 20,
		Rewriters: []relay.Rewriter{wasm.NewRewriter(c, log)}}, d, nil, nil, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = c.Run(ctx); done <- struct{}{} }()
	go func() {
		if err := srv.Run(ctx); err != nil {
			t.Errorf("relay run: %v", err)
		}
		done <- struct{}{}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done; d.Close() })
	<-srv.Bound()
	return socket
}

func (u *upstreamServer) setECDS(t *testing.T, node, version string, ecs ...*corev3.TypedExtensionConfig) {
	t.Helper()
	rs := make([]types.Resource, len(ecs))
	for i, ec := range ecs {
		rs[i] = ec
	}
	u.setSnapshot(node, version, map[resource.Type][]types.Resource{resource.ExtensionConfigType: rs})
}

// openECDS opens a SotW stream through the relay and asks for names.
func openECDS(t *testing.T, ctx context.Context, socket, id string, names ...string) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	st, err := ads(t, socket).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(id), TypeUrl: resource.ExtensionConfigType, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	return st
}

// recvECDS receives the next response, ACKs it, and returns its configs by name.
func recvECDS(t *testing.T, st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, names []string) (string, map[string]*corev3.TypedExtensionConfig) {
	t.Helper()
	r, err := st.Recv()
	if err != nil {
		t.Fatalf("ecds response: %v", err)
	}
	out := map[string]*corev3.TypedExtensionConfig{}
	for _, a := range r.GetResources() {
		ec := &corev3.TypedExtensionConfig{}
		if err := a.UnmarshalTo(ec); err != nil {
			t.Fatalf("resource %s: %v", a.GetTypeUrl(), err)
		}
		out[ec.GetName()] = ec
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ExtensionConfigType, ResourceNames: names,
		VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	return r.GetVersionInfo(), out
}

// localModule returns the file ec's Wasm VM loads, failing if it still loads remotely.
func localModule(t *testing.T, ec *corev3.TypedExtensionConfig) (string, *httpwasm.Wasm) {
	t.Helper()
	f := &httpwasm.Wasm{}
	if err := ec.GetTypedConfig().UnmarshalTo(f); err != nil {
		t.Fatalf("%s: not a Wasm filter: %v (%s)", ec.GetName(), err, ec.GetTypedConfig().GetTypeUrl())
	}
	p := f.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename()
	if p == "" {
		t.Fatalf("%s: still loads %v", ec.GetName(), f.GetConfig().GetVmConfig().GetCode())
	}
	return p, f
}

// files lists the regular files under dir (temporary ones included).
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A good module: Envoy gets the config pointing at a file in the cache holding
// exactly the module's bytes, with istiod's ISTIO_META_* variables stripped and
// the plugin's own kept; a second push of the plugin is served from the cache
// (the HTTP server saw one download), and a changed module is downloaded anew.
func TestECDSWasmRemoteLoadRewrittenToCachedFile(t *testing.T) {
	module2 := append(append([]byte(nil), module...), 0x00) // another "module": the header is all the agent checks, as Istio's
	ms := startModuleServer(t, map[string][]byte{"/good.wasm": module, "/v2.wasm": module2})
	up := startUpstream(t)
	dir := t.TempDir()
	name := "extensions.istio.io/trafficextension/shop.stats"
	up.setECDS(t, "n1", "v1", wasmPlugin(t, name, ms.URL+"/good.wasm", sha(module), wasmv3.FailurePolicy_FAIL_CLOSED, "a"))
	socket := startWasmRelay(t, up.addr, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openECDS(t, ctx, socket, "n1", name)

	v, got := recvECDS(t, st, []string{name})
	p, f := localModule(t, got[name])
	if v != "v1" || !strings.HasPrefix(p, dir+"/") {
		t.Fatalf("version %q, module at %s: want v1, a file under %s", v, p, dir)
	}
	if b, err := os.ReadFile(p); err != nil || sha(b) != sha(module) {
		t.Fatalf("cached module %x (%v), want %x", b, err, module)
	}
	env := f.GetConfig().GetVmConfig().GetEnvironmentVariables().GetKeyValues()
	if len(env) != 1 || env["GREETING"] != "hello" {
		t.Errorf("VM environment %v: want GREETING alone (istiod's ISTIO_META_* are the agent's)", env)
	}
	if ms.hitsOf("/good.wasm") != 1 { // the positive control of the cache check below
		t.Fatalf("module server saw %d downloads, want 1", ms.hitsOf("/good.wasm"))
	}

	// Pushed again (the plugin's config changed): from the cache.
	up.setECDS(t, "n1", "v2", wasmPlugin(t, name, ms.URL+"/good.wasm", sha(module), wasmv3.FailurePolicy_FAIL_CLOSED, "b"))
	v, got = recvECDS(t, st, []string{name})
	p2, f2 := localModule(t, got[name])
	if v != "v2" || p2 != p || f2.GetConfig().GetRootId() != "b" {
		t.Fatalf("second push: version %q, module %s, root %q: want v2, %s, b", v, p2, f2.GetConfig().GetRootId(), p)
	}
	if n := ms.hitsOf("/good.wasm"); n != 1 {
		t.Fatalf("module downloaded %d times for two pushes, want once (cached)", n)
	}

	// Another module: downloaded, and kept beside the first.
	up.setECDS(t, "n1", "v3", wasmPlugin(t, name, ms.URL+"/v2.wasm", sha(module2), wasmv3.FailurePolicy_FAIL_CLOSED, "c"))
	_, got = recvECDS(t, st, []string{name})
	p3, _ := localModule(t, got[name])
	if b, err := os.ReadFile(p3); err != nil || sha(b) != sha(module2) || p3 == p {
		t.Fatalf("second module at %s: %x (%v)", p3, b, err)
	}
	if fs := files(t, dir); len(fs) != 2 {
		t.Fatalf("cache holds %v, want the two modules alone", fs)
	}
}

// A module that cannot be had gets Istio's failure behaviour: a deny-all RBAC
// filter for a plugin that fails closed, allow-all for one that fails open, and
// nothing is written to the cache for it; a good plugin in the same response is
// rewritten and cached (the positive control: the cache check would see a file).
func TestECDSWasmRemoteLoadFailures(t *testing.T) {
	wrong := append(append([]byte(nil), module...), 0x00)
	ms := startModuleServer(t, map[string][]byte{"/good.wasm": module, "/wrong.wasm": wrong})
	up := startUpstream(t)
	dir := t.TempDir()
	dead := deadURL(t)
	tests := []struct {
		name, url, sum string
		policy         wasmv3.FailurePolicy
		allow          bool
	}{
		{"wrong-sha-closed", ms.URL + "/wrong.wasm", sha(module), wasmv3.FailurePolicy_FAIL_CLOSED, false},
		{"wrong-sha-open", ms.URL + "/wrong.wasm", sha(module), wasmv3.FailurePolicy_FAIL_OPEN, true},
		{"wrong-sha-unspecified", ms.URL + "/wrong.wasm", sha(module), wasmv3.FailurePolicy_UNSPECIFIED, false},
		{"unreachable-closed", dead, sha(module), wasmv3.FailurePolicy_FAIL_CLOSED, false},
		{"unreachable-open", dead, sha(module), wasmv3.FailurePolicy_FAIL_OPEN, true},
		{"not-found-closed", ms.URL + "/missing.wasm", "", wasmv3.FailurePolicy_FAIL_CLOSED, false},
	}
	ecs := []*corev3.TypedExtensionConfig{wasmPlugin(t, "good", ms.URL+"/good.wasm", sha(module), wasmv3.FailurePolicy_FAIL_CLOSED, "g")}
	names := []string{"good"}
	for _, tt := range tests {
		ecs = append(ecs, wasmPlugin(t, tt.name, tt.url, tt.sum, tt.policy, "x"))
		names = append(names, tt.name)
	}
	up.setECDS(t, "n1", "v1", ecs...)
	socket := startWasmRelay(t, up.addr, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openECDS(t, ctx, socket, "n1", names...)
	_, got := recvECDS(t, st, names)

	good, _ := localModule(t, got["good"])
	if fs := files(t, dir); len(fs) != 1 || fs[0] != good {
		t.Fatalf("cache holds %v, want the good module alone (%s)", fs, good)
	}
	if ms.hitsOf("/wrong.wasm") == 0 {
		t.Fatal("the wrong module was never downloaded: its rejection proves nothing")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ec := got[tt.name]
			rb := &httprbac.RBAC{}
			if err := ec.GetTypedConfig().UnmarshalTo(rb); err != nil {
				t.Fatalf("got %s, want the RBAC fallback: %v", ec.GetTypedConfig().GetTypeUrl(), err)
			}
			if denies := rb.GetRules() != nil; denies == tt.allow {
				t.Fatalf("RBAC %v: allow=%v, want allow=%v", rb, !denies, tt.allow)
			}
			want := wasm.DenyStatPrefix
			if tt.allow {
				want = wasm.AllowStatPrefix
			}
			if rb.GetRulesStatPrefix() != want {
				t.Errorf("stat prefix %q, want %q", rb.GetRulesStatPrefix(), want)
			}
		})
	}
}

// A config the relay cannot read (a Wasm filter with no code at all) is NACKed
// upstream with Envoy's last accepted version, as Istio's agent does, and Envoy
// never sees it: its next response is the following good version. (go-control-plane
// answers a NACK by sending the rejected version again, so the relay NACKs it
// again until v3: istiod does not resend on a NACK.)
func TestECDSWasmUnreadableConfigNACKed(t *testing.T) {
	ms := startModuleServer(t, map[string][]byte{"/good.wasm": module})
	up := startUpstream(t)
	name := "plugin"
	up.setECDS(t, "n1", "v1", wasmPlugin(t, name, ms.URL+"/good.wasm", sha(module), wasmv3.FailurePolicy_FAIL_OPEN, "a"))
	socket := startWasmRelay(t, up.addr, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openECDS(t, ctx, socket, "n1", name)
	if v, got := recvECDS(t, st, []string{name}); v != "v1" || got[name] == nil {
		t.Fatalf("first response %q %v", v, got)
	}

	broken := wasmPlugin(t, name, "", "", wasmv3.FailurePolicy_FAIL_OPEN, "a")
	f := &httpwasm.Wasm{}
	_ = broken.GetTypedConfig().UnmarshalTo(f)
	f.Config.GetVmConfig().Code = nil
	broken.TypedConfig, _ = anypb.New(f)
	up.setECDS(t, "n1", "v2", broken)
	testkit.Eventually(t, "the relay's NACK of v2 upstream, carrying v1", func() bool {
		return len(up.seen(func(r *discoveryv3.DiscoveryRequest) bool {
			return r.GetTypeUrl() == resource.ExtensionConfigType && r.GetErrorDetail() != nil && r.GetVersionInfo() == "v1" &&
				strings.Contains(r.GetErrorDetail().GetMessage(), "no remote and local load")
		})) > 0
	})

	up.setECDS(t, "n1", "v3", wasmPlugin(t, name, ms.URL+"/good.wasm", sha(module), wasmv3.FailurePolicy_FAIL_OPEN, "c"))
	v, got := recvECDS(t, st, []string{name})
	if v != "v3" {
		t.Fatalf("Envoy's next response is %q, want v3 (v2 was NACKed by the relay)", v)
	}
	localModule(t, got[name])
}

// On a delta stream the same rewrite applies: Envoy's resource loads the
// cached file, its name and version kept.
func TestECDSWasmRemoteLoadOnDeltaStream(t *testing.T) {
	ms := startModuleServer(t, map[string][]byte{"/good.wasm": module})
	up := startUpstream(t)
	dir := t.TempDir()
	up.setECDS(t, "n1", "v1", wasmPlugin(t, "plugin", ms.URL+"/good.wasm", sha(module), wasmv3.FailurePolicy_FAIL_CLOSED, "a"))
	socket := startWasmRelay(t, up.addr, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := ads(t, socket).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node("n1"), TypeUrl: resource.ExtensionConfigType,
		ResourceNamesSubscribe: []string{"plugin"}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil || len(r.GetResources()) != 1 {
		t.Fatalf("delta response %v %v", r, err)
	}
	res := r.GetResources()[0]
	ec := &corev3.TypedExtensionConfig{}
	if err := res.GetResource().UnmarshalTo(ec); err != nil {
		t.Fatal(err)
	}
	p, _ := localModule(t, ec)
	if b, err := os.ReadFile(p); err != nil || sha(b) != sha(module) || !strings.HasPrefix(p, dir+"/") {
		t.Fatalf("module at %s: %x %v", p, b, err)
	}
	if res.GetName() != "plugin" || res.GetVersion() == "" {
		t.Fatalf("resource name %q version %q: want plugin and the upstream's version", res.GetName(), res.GetVersion())
	}
}
