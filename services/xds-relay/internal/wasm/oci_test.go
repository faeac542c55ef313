package wasm

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/meshagent/meshagent/pkg/clock"
)

// registryHits is a real in-memory OCI registry over HTTP counting GETs of
// manifests and blobs.
type registryHits struct {
	*httptest.Server
	mu               sync.Mutex
	manifests, blobs int
}

func startOCIRegistry(t *testing.T) *registryHits {
	r := &registryHits{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet {
			r.mu.Lock()
			r.manifests += strings.Count(req.URL.Path, "/manifests/")
			r.blobs += strings.Count(req.URL.Path, "/blobs/")
			r.mu.Unlock()
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *registryHits) counts() (manifests, blobs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.manifests, r.blobs
}

func (r *registryHits) push(t *testing.T, repoTag string, mod []byte) string {
	t.Helper()
	img, err := mutate.Append(empty.Image,
		mutate.Addendum{Layer: static.NewLayer(mod, wasmLayerType)},
		mutate.Addendum{Layer: static.NewLayer([]byte(`{}`), "application/vnd.module.wasm.config.v1+json")})
	if err != nil {
		t.Fatal(err)
	}
	var i v1.Image = mutate.MediaType(img, types.OCIManifestSchema1)
	ref, err := name.ParseReference(strings.TrimPrefix(r.URL, "http://") + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, i); err != nil {
		t.Fatal(err)
	}
	d, _ := i.Digest()
	return d.Hex
}

// Istio's pull policies for images: with none, a :latest tag is asked for
// its manifest again on a new plugin version (and an unchanged digest is not
// pulled again), another tag is not; Always asks again on a new version; a
// retagged image is pulled and kept beside the old one in the image's
// directory; a digest in the URL needs no manifest request once cached.
func TestCacheOCIPullPolicies(t *testing.T) {
	reg := startOCIRegistry(t)
	host := strings.TrimPrefix(reg.URL, "http://")
	d1 := reg.push(t, "shop/stats:latest", wasmModule)
	reg.push(t, "shop/stats:v1", wasmModule)
	c := newTestCache(t, clock.Real{})
	get := func(ref string, policy PullPolicy, version string) string {
		t.Helper()
		p, err := c.Get(context.Background(), "oci://"+host+"/"+ref, GetOptions{ResourceName: "ns.p", ResourceVersion: version,
			PullPolicy: policy, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	want := func(step string, manifests, blobs int) {
		t.Helper()
		if m, b := reg.counts(); m != manifests || b != blobs {
			t.Fatalf("%s: %d manifest and %d blob requests, want %d and %d", step, m, b, manifests, blobs)
		}
	}
	p := get("shop/stats:latest", PullUnspecified, "1")
	if b, _ := os.ReadFile(p); string(b) != string(wasmModule) || !strings.HasSuffix(p, "/"+d1+".wasm") {
		t.Fatalf("cached %s: %x", p, b)
	}
	_, blobs := reg.counts()
	want("first pull", 1, blobs)
	if blobs == 0 {
		t.Fatal("no blob was pulled: the counts below prove nothing")
	}
	get("shop/stats:latest", PullUnspecified, "1")
	want(":latest, same version", 1, blobs)
	get("shop/stats:latest", PullUnspecified, "2")
	want(":latest, new version: manifest again, same digest, no blob", 2, blobs)
	get("shop/stats:v1", PullUnspecified, "1")
	want("another tag of the same image: its manifest, the module from the cache", 3, blobs)
	get("shop/stats:v1", PullUnspecified, "2")
	want(":v1, new version, no policy", 3, blobs)
	get("shop/stats:v1", PullAlways, "3")
	want(":v1, Always, new version", 4, blobs)
	get("shop/stats@sha256:"+d1, PullUnspecified, "4")
	want("a cached digest", 4, blobs)

	module2 := append(append([]byte(nil), wasmModule...), 0x09)
	d2 := reg.push(t, "shop/stats:latest", module2)
	m0, b0 := reg.counts()
	p2 := get("shop/stats:latest", PullUnspecified, "5")
	if b, _ := os.ReadFile(p2); string(b) != string(module2) || !strings.HasSuffix(p2, "/"+d2+".wasm") {
		t.Fatalf("retagged image cached at %s: %x", p2, b)
	}
	if m, b := reg.counts(); m != m0+1 || b <= b0 {
		t.Fatalf("retagged: %d manifest, %d blob requests more, want 1 and some", m-m0, b-b0)
	}
	if fs, _ := os.ReadDir(strings.TrimSuffix(p2, "/"+d2+".wasm")); len(fs) != 2 {
		t.Fatalf("the image's directory holds %v, want both modules", fs)
	}
}

// A registry's 401 sending the token request to a loopback, private,
// link-local or non-HTTP realm is refused before any request goes there (Istio's
// SSRF guard); a public realm passes. go-containerregistry refuses such realms
// too, except at the registry's own host:port, which Istio's guard refuses as
// well: the pull below asks for a token there.
func TestRegistryRealmGuard(t *testing.T) {
	for realm, ok := range map[string]bool{
		"https://auth.example.com/token": true, "http://127.0.0.1:1/token": false, "http://localhost/token": false,
		"http://169.254.169.254/latest": false, "http://10.0.0.1/t": false, "file:///etc/passwd": false,
		"http://metadata.google.internal/": false, "http://[::1]/t": false,
	} {
		if err := checkRealm(realm); (err == nil) != ok {
			t.Errorf("realm %s: %v, want accepted=%v", realm, err, ok)
		}
	}
	var mu sync.Mutex
	asked := false
	var reg *httptest.Server
	reg = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			mu.Lock()
			asked = true
			mu.Unlock()
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="`+reg.URL+`/token",service="r"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(reg.Close)
	c := newTestCache(t, clock.Real{})
	_, err := c.Get(context.Background(), "oci://"+strings.TrimPrefix(reg.URL, "http://")+"/shop/stats:v1",
		GetOptions{Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "rejected unsafe bearer realm") {
		t.Fatalf("pull: %v, want the realm refused", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked {
		t.Fatal("the token endpoint on loopback was asked")
	}
}
