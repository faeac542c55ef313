//go:build istio

package main

// Against Istio's real istiod: a WasmPlugin whose module is an OCI image in a
// real registry (go-containerregistry's in-memory registry over HTTP, the
// images pushed with remote.Write) reaches the pod's Envoy through xds-relay
// loading the module the relay pulled.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/meshagent/meshagent/tests/istiotest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestIstiodWasmPluginOCIThroughTheRelay: WasmPlugins with oci:// URLs to a
// registry on loopback (plain HTTP, as go-containerregistry speaks to
// loopback registries):
//   - the Wasm artifact image (a raw application/vnd.module.wasm.content.layer.v1+wasm
//     layer) with the manifest's digest as sha256, and a Docker image (plugin.wasm
//     in a tar.gz layer) without one, reach the stand-in loading files under
//     /var/lib/istio/data/<sha256 of oci://host/repo>/<manifest digest>.wasm
//     holding exactly the modules;
//   - a WasmPlugin whose sha256 is the module's (not the manifest's) gets the
//     deny-all RBAC filter; its manifest was read, its layers never pulled, and
//     nothing of it is in the cache.
func TestIstiodWasmPluginOCIThroughTheRelay(t *testing.T) {
	module := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	module2 := append(slices.Clone(module), 0x00)
	var mu sync.Mutex
	hits := map[string]int{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			for _, kind := range []string{"manifests", "blobs"} {
				if repo, _, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), "/"+kind+"/"); ok {
					mu.Lock()
					hits[repo+" "+kind]++
					mu.Unlock()
				}
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(reg.Close)
	hitsOf := func(k string) int { mu.Lock(); defer mu.Unlock(); return hits[k] }
	host := strings.TrimPrefix(reg.URL, "http://")
	push := func(repoTag string, img v1.Image) string {
		ref, err := name.ParseReference(host + "/" + repoTag)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		return d.Hex
	}
	artDigest := push("shop/stats:v1", ociArtifact(t, module))
	dockDigest := push("shop/docker:v1", dockerWasmImage(t, module2))
	push("shop/other:v1", ociArtifact(t, module2))

	kube := kubetest.Start(t)
	d := istiotest.Start(t, kube, istiotest.Config{})
	root, logs := startIstiodMeshPod(t, kube, d)
	_, env := sidecarEnv(t)
	ns := env["POD_NAMESPACE"]
	plugin := func(name, url, sum string) {
		spec := map[string]any{"url": url, "selector": map[string]any{"matchLabels": map[string]any{"app": "web"}}}
		if sum != "" {
			spec["sha256"] = sum
		}
		kube.Admin.Create(t, "/apis/extensions.istio.io/v1alpha1/namespaces/"+ns+"/wasmplugins", map[string]any{
			"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin", "metadata": kubetest.Meta{Name: name}, "spec": spec})
	}
	plugin("art", "oci://"+host+"/shop/stats:v1", artDigest)
	plugin("dock", "oci://"+host+"/shop/docker:v1", "")
	plugin("wrong", "oci://"+host+"/shop/other:v1", sha256hex(module2))

	testkit.EventuallyWithin(t, 90*time.Second, "the relay's ADS socket and Envoy's bootstrap", func() bool {
		_, err := os.Stat(filepath.Join(root, "etc/istio/proxy/envoy-rev.json"))
		return err == nil && strings.Contains(logs.String(), "ads Listener")
	})
	envoy := newEnvoyECDS(t, root)
	data := filepath.Join(root, "var/lib/istio/data")
	var good []string
	for _, c := range []struct {
		plugin, repo, digest string
		want                 []byte
	}{{"art", "shop/stats", artDigest, module}, {"dock", "shop/docker", dockDigest, module2}} {
		ec := envoy.waitConfig(t, 60*time.Second, c.plugin)
		p := wasmFile(t, ec)
		if want := filepath.Join(data, sha256hex([]byte("oci://"+host+"/"+c.repo)), c.digest+".wasm"); p != want {
			t.Fatalf("%s loads %s, want %s", ec.GetName(), p, want)
		}
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(b, c.want) {
			t.Fatalf("%s: %s holds %x (%v), want %x", ec.GetName(), p, b, err, c.want)
		}
		t.Logf("istiod's ECDS %s reached the stand-in loading %s (module sha256 %s)", ec.GetName(), p, sha256hex(b))
		good = append(good, p)
	}
	ec := envoy.waitConfig(t, 60*time.Second, "wrong")
	rb := &httprbac.RBAC{}
	if err := ec.GetTypedConfig().UnmarshalTo(rb); err != nil || rb.GetRules() == nil || rb.GetRulesStatPrefix() != "wasm-default-deny" {
		t.Fatalf("%s with the module's sha256 for an image reached the stand-in as %s %v (%v), want the deny-all RBAC",
			ec.GetName(), ec.GetTypedConfig().GetTypeUrl(), rb, err)
	}
	t.Logf("istiod's ECDS %s with the module's sha256 reached the stand-in as RBAC %s", ec.GetName(), rb.GetRulesStatPrefix())
	if hitsOf("shop/other manifests") == 0 || hitsOf("shop/other blobs") != 0 {
		t.Fatalf("the mismatched image: %d manifest, %d blob requests, want its manifest read and no blob",
			hitsOf("shop/other manifests"), hitsOf("shop/other blobs"))
	}
	var cached []string
	_ = filepath.WalkDir(data, func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() {
			cached = append(cached, p)
		}
		return err
	})
	slices.Sort(cached)
	slices.Sort(good)
	if !slices.Equal(cached, good) {
		t.Fatalf("the pod's wasm cache holds %v, want the two good modules alone", cached)
	}
	for _, repo := range []string{"shop/stats", "shop/docker"} {
		if n := hitsOf(repo + " manifests"); n != 1 {
			t.Errorf("%s: %d manifest requests over istiod's pushes, want 1 (cached; the tag is not :latest)", repo, n)
		}
	}
}

// ociArtifact is the Wasm OCI artifact form: the raw module as a
// application/vnd.module.wasm.content.layer.v1+wasm layer beside a config layer.
func ociArtifact(t *testing.T, mod []byte) v1.Image {
	t.Helper()
	img, err := mutate.Append(empty.Image,
		mutate.Addendum{Layer: static.NewLayer(mod, "application/vnd.module.wasm.content.layer.v1+wasm")},
		mutate.Addendum{Layer: static.NewLayer([]byte(`{}`), "application/vnd.module.wasm.config.v1+json")})
	if err != nil {
		t.Fatal(err)
	}
	return mutate.MediaType(img, types.OCIManifestSchema1)
}

// dockerWasmImage is the Docker image form: one tar.gz layer holding plugin.wasm.
func dockerWasmImage(t *testing.T, mod []byte) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "plugin.wasm", Mode: 0o644, Size: int64(len(mod))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(mod); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: static.NewLayer(buf.Bytes(), types.DockerLayer)})
	if err != nil {
		t.Fatal(err)
	}
	return img
}
