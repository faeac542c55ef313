package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

// The Wasm remote load is on by default with Istio's pkg/wasm defaults, its
// cache under the pod root, and Istio's env names set it.
func TestWasmKnobs(t *testing.T) {
	c, err := Load([]string{"-pod", "p", "-pod-root", "/pods/p"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Wasm; !w.RemoteLoad || w.Dir != "/pods/p/var/lib/istio/data" || w.ModuleExpiry != 24*time.Hour ||
		w.PurgeInterval != time.Hour || w.RequestTimeout != 15*time.Second || w.MaxAttempts != 5 || w.MaxBytes != 256<<20 {
		t.Fatalf("defaults %+v", w)
	}
	c, err = Load([]string{"-pod", "p", "-pod-root", "/pods/p"}, testkit.Env(map[string]string{
		"ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION": "false", "WASM_MODULE_EXPIRY": "1h", "WASM_PURGE_INTERVAL": "5m",
		"WASM_HTTP_REQUEST_TIMEOUT": "3s", "WASM_HTTP_REQUEST_MAX_RETRIES": "2", "WASM_INSECURE_REGISTRIES": "a.example,b.example",
		"ISTIO_WASM_MAX_BINARY_SIZE_BYTES": "1024", "WASM_CACHE_DIR": "/var/cache/wasm"}))
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Wasm; w.RemoteLoad || w.Dir != "/var/cache/wasm" || w.ModuleExpiry != time.Hour ||
		w.PurgeInterval != 5*time.Minute || w.RequestTimeout != 3*time.Second || w.MaxAttempts != 2 || w.MaxBytes != 1024 ||
		!slices.Equal(w.InsecureRegistries, []string{"a.example", "b.example"}) {
		t.Fatalf("from the environment %+v", w)
	}
}

func TestWasmKnobsValidated(t *testing.T) {
	_, err := Load([]string{"-pod", "p", "-wasm-http-request-max-retries", "0", "-wasm-max-binary-size", "4", "-wasm-purge-interval", "0s"},
		testkit.Env(nil))
	if err == nil {
		t.Fatal("bad Wasm knobs accepted")
	}
	for _, want := range []string{"-wasm-http-request-max-retries: 0", "-wasm-max-binary-size: 4", "must be positive"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	// Off, the knobs are not looked at.
	if _, err := Load([]string{"-pod", "p", "-wasm-remote-load=false", "-wasm-http-request-max-retries", "0"}, testkit.Env(nil)); err != nil {
		t.Fatalf("knobs of a disabled remote load rejected: %v", err)
	}
}
