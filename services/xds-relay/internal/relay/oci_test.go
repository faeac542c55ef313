package relay_test

// ECDS's Wasm remote load of oci:// images through the relay, against a real
// OCI registry (go-containerregistry's pkg/registry, over real HTTP) holding
// images pushed with go-containerregistry's remote.Write.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
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
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/meshagent/meshagent/services/xds-relay/internal/wasm"
)

// ociRegistry is a real in-memory OCI registry over HTTP that counts the
// manifest and blob requests per repository.
type ociRegistry struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int // "<repo> manifests" / "<repo> blobs"
}

func startRegistry(t *testing.T) *ociRegistry {
	t.Helper()
	r := &ociRegistry{hits: map[string]int{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet {
			for _, kind := range []string{"manifests", "blobs"} {
				if repo, _, ok := strings.Cut(strings.TrimPrefix(req.URL.Path, "/v2/"), "/"+kind+"/"); ok {
					r.mu.Lock()
					r.hits[repo+" "+kind]++
					r.mu.Unlock()
				}
			}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *ociRegistry) hitsOf(repo, kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits[repo+" "+kind]
}

// host is the registry's host:port (loopback: go-containerregistry speaks plain HTTP to it).
func (r *ociRegistry) host() string { return strings.TrimPrefix(r.URL, "http://") }

// push writes img as host/repo:tag with remote.Write and returns the manifest's hex digest.
func (r *ociRegistry) push(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host() + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.Hex
}

// artifactImage is the Wasm OCI artifact form Istio reads: an OCI manifest with
// the raw module as an application/vnd.module.wasm.content.layer.v1+wasm layer
// beside a config layer.
func artifactImage(t *testing.T, mod []byte) v1.Image {
	t.Helper()
	img, err := mutate.Append(empty.Image,
		mutate.Addendum{Layer: static.NewLayer(mod, "application/vnd.module.wasm.content.layer.v1+wasm")},
		mutate.Addendum{Layer: static.NewLayer([]byte(`{}`), "application/vnd.module.wasm.config.v1+json")})
	if err != nil {
		t.Fatal(err)
	}
	return mutate.MediaType(img, types.OCIManifestSchema1)
}

// dockerImage is the Docker image form: one tar.gz layer holding plugin.wasm.
func dockerImage(t *testing.T, mod []byte) v1.Image { return tarGzImage(t, mod, false) }

// tarGzImage is the image of one tar.gz layer holding plugin.wasm after another
// file: Docker's media types, or with oci the OCI manifest and
// application/vnd.oci.image.layer.v1.tar+gzip layer.
func tarGzImage(t *testing.T, mod []byte, oci bool) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range []struct {
		name string
		body []byte
	}{{"README", []byte("not the module")}, {"plugin.wasm", mod}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if oci {
		img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: static.NewLayer(buf.Bytes(), types.OCILayer)})
		if err != nil {
			t.Fatal(err)
		}
		return mutate.MediaType(img, types.OCIManifestSchema1)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: static.NewLayer(buf.Bytes(), types.DockerLayer)})
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.DockerManifestSchema2 {
		t.Fatalf("docker image has manifest type %s", mt)
	}
	return img
}

// cachedAt is where the cache keeps an image's module: the sha256 of
// oci://host/repo (tag dropped), then the manifest digest, as Istio's agent.
func cachedAt(dir, host, repo, digest string) string {
	s := sha256.Sum256([]byte("oci://" + host + "/" + repo))
	return filepath.Join(dir, hex.EncodeToString(s[:]), digest+".wasm")
}

// The three image forms are pulled from a real registry: the file Envoy is pointed
// at holds exactly the module, named by the manifest digest the WasmPlugin's
// sha256 gave (or, without one, the digest the registry served); a second push
// of the plugins is served from the cache (no new manifest request: the tags
// are not :latest, so IfNotPresent).
func TestECDSWasmOCIImagesRewrittenToCachedFile(t *testing.T) {
	module2 := append(append([]byte(nil), module...), 0x00, 0x01)
	reg := startRegistry(t)
	artDigest := reg.push(t, "shop/stats:v1", artifactImage(t, module))
	dockDigest := reg.push(t, "shop/docker:v1", dockerImage(t, module2))
	module3 := append(append([]byte(nil), module...), 0x03)
	compatDigest := reg.push(t, "shop/compat:v1", tarGzImage(t, module3, true))
	up := startUpstream(t)
	dir := t.TempDir()
	art, dock, compat := "oci://"+reg.host()+"/shop/stats:v1", "oci://"+reg.host()+"/shop/docker:v1", "oci://"+reg.host()+"/shop/compat:v1"
	plugins := func(root string) []*corev3.TypedExtensionConfig {
		return []*corev3.TypedExtensionConfig{
			wasmPlugin(t, "art", art, artDigest, wasmv3.FailurePolicy_FAIL_CLOSED, root),
			wasmPlugin(t, "dock", dock, "", wasmv3.FailurePolicy_FAIL_CLOSED, root),
			wasmPlugin(t, "compat", compat, compatDigest, wasmv3.FailurePolicy_FAIL_CLOSED, root)}
	}
	up.setECDS(t, "n1", "v1", plugins("a")...)
	socket := startWasmRelay(t, up.addr, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := []string{"art", "dock", "compat"}
	st := openECDS(t, ctx, socket, "n1", names...)
	_, got := recvECDS(t, st, names)

	for _, c := range []struct {
		plugin, repo, digest string
		want                 []byte
	}{{"art", "shop/stats", artDigest, module}, {"dock", "shop/docker", dockDigest, module2}, {"compat", "shop/compat", compatDigest, module3}} {
		p, _ := localModule(t, got[c.plugin])
		if want := cachedAt(dir, reg.host(), c.repo, c.digest); p != want {
			t.Errorf("%s: module at %s, want %s", c.plugin, p, want)
		}
		if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, c.want) {
			t.Errorf("%s: cached %x (%v), want %x", c.plugin, b, err, c.want)
		}
		if reg.hitsOf(c.repo, "manifests") != 1 { // the positive control of the cache check below
			t.Fatalf("%s: %d manifest requests, want 1", c.plugin, reg.hitsOf(c.repo, "manifests"))
		}
	}
	if fs := files(t, dir); len(fs) != 3 {
		t.Fatalf("cache holds %v, want the three modules alone", fs)
	}

	up.setECDS(t, "n1", "v2", plugins("b")...)
	_, got = recvECDS(t, st, names)
	for _, c := range []struct{ plugin, repo string }{{"art", "shop/stats"}, {"dock", "shop/docker"}, {"compat", "shop/compat"}} {
		localModule(t, got[c.plugin])
		if n := reg.hitsOf(c.repo, "manifests"); n != 1 {
			t.Errorf("%s: %d manifest requests after a second push, want 1 (cached)", c.plugin, n)
		}
	}
}

// An image that cannot be had gets the failure filter and leaves nothing on
// disk: a sha256 that is not the manifest's digest (here the module's own
// sha256, which Istio does not accept for an image either; the module's layer
// is then not even pulled), a registry nobody listens on, a tag the registry
// does not have. The good image beside them is the positive control.
func TestECDSWasmOCIImageFailures(t *testing.T) {
	reg := startRegistry(t)
	digest := reg.push(t, "shop/stats:v1", artifactImage(t, module))
	reg.push(t, "shop/other:v1", artifactImage(t, append(append([]byte(nil), module...), 0x02)))
	dead := strings.TrimSuffix(strings.TrimPrefix(deadURL(t), "http://"), "/gone.wasm")
	up := startUpstream(t)
	dir := t.TempDir()
	tests := []struct {
		name, url, sum string
		policy         wasmv3.FailurePolicy
		allow          bool
	}{
		{"module-sha-closed", "oci://" + reg.host() + "/shop/other:v1", sha(module), wasmv3.FailurePolicy_FAIL_CLOSED, false},
		{"module-sha-open", "oci://" + reg.host() + "/shop/other:v1", sha(module), wasmv3.FailurePolicy_FAIL_OPEN, true},
		{"unreachable-closed", "oci://" + dead + "/shop/stats:v1", digest, wasmv3.FailurePolicy_FAIL_CLOSED, false},
		{"unreachable-open", "oci://" + dead + "/shop/stats:v1", digest, wasmv3.FailurePolicy_FAIL_OPEN, true},
		{"no-such-tag", "oci://" + reg.host() + "/shop/stats:v9", "", wasmv3.FailurePolicy_UNSPECIFIED, false},
	}
	ecs := []*corev3.TypedExtensionConfig{wasmPlugin(t, "good", "oci://"+reg.host()+"/shop/stats:v1", digest, wasmv3.FailurePolicy_FAIL_CLOSED, "g")}
	names := []string{"good"}
	for _, tt := range tests {
		ecs = append(ecs, wasmPlugin(t, tt.name, tt.url, tt.sum, tt.policy, "x"))
		names = append(names, tt.name)
	}
	up.setECDS(t, "n1", "v1", ecs...)
	socket := startWasmRelay(t, up.addr, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st := openECDS(t, ctx, socket, "n1", names...)
	_, got := recvECDS(t, st, names)

	good, _ := localModule(t, got["good"])
	if fs := files(t, dir); len(fs) != 1 || fs[0] != good {
		t.Fatalf("cache holds %v, want the good module alone (%s)", fs, good)
	}
	if reg.hitsOf("shop/other", "manifests") == 0 {
		t.Fatal("the mismatched image's manifest was never read: its rejection proves nothing")
	}
	if n := reg.hitsOf("shop/other", "blobs"); n != 0 {
		t.Errorf("%d blob requests for the image whose digest did not match, want none", n)
	}
	if reg.hitsOf("shop/stats", "blobs") == 0 {
		t.Error("the good image's layers were never pulled")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rb := &httprbac.RBAC{}
			if err := got[tt.name].GetTypedConfig().UnmarshalTo(rb); err != nil {
				t.Fatalf("got %s, want the RBAC fallback: %v", got[tt.name].GetTypedConfig().GetTypeUrl(), err)
			}
			want := wasm.DenyStatPrefix
			if tt.allow {
				want = wasm.AllowStatPrefix
			}
			if denies := rb.GetRules() != nil; denies == tt.allow || rb.GetRulesStatPrefix() != want {
				t.Fatalf("RBAC %v: want allow=%v, stat prefix %s", rb, tt.allow, want)
			}
		})
	}
}
