package config

import (
	"time"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

// Wasm is the Wasm remote load (internal/wasm) with Istio's agent's knobs.
type Wasm struct {
	RemoteLoad         bool   // ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION
	Dir                string // module cache (Istio: /var/lib/istio/data)
	ModuleExpiry       time.Duration
	PurgeInterval      time.Duration
	RequestTimeout     time.Duration
	MaxAttempts        int
	InsecureRegistries []string
	MaxBytes           int
}

// defaultWasm is Istio's pkg/wasm defaults.
func defaultWasm() Wasm {
	return Wasm{RemoteLoad: true, Dir: "var/lib/istio/data", ModuleExpiry: 24 * time.Hour, PurgeInterval: time.Hour,
		RequestTimeout: 15 * time.Second, MaxAttempts: 5, MaxBytes: 256 << 20}
}

func (w *Wasm) bind(fs *flagenv.Set) {
	fs.Bool(&w.RemoteLoad, "wasm-remote-load", "ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION", w.RemoteLoad,
		"rewrite ECDS Wasm filters that load their module from an http(s) URL to load it from a file the relay downloaded, checked and cached")
	fs.String(&w.Dir, "wasm-cache-dir", "WASM_CACHE_DIR", w.Dir, "where downloaded Wasm modules are kept (under -pod-root if relative)")
	fs.Duration(&w.ModuleExpiry, "wasm-module-expiry", "WASM_MODULE_EXPIRY", w.ModuleExpiry, "a cached Wasm module unused this long is removed")
	fs.Duration(&w.PurgeInterval, "wasm-purge-interval", "WASM_PURGE_INTERVAL", w.PurgeInterval, "how often expired Wasm modules are looked for")
	fs.Duration(&w.RequestTimeout, "wasm-http-request-timeout", "WASM_HTTP_REQUEST_TIMEOUT", w.RequestTimeout, "bound on one Wasm module download attempt")
	fs.Int(&w.MaxAttempts, "wasm-http-request-max-retries", "WASM_HTTP_REQUEST_MAX_RETRIES", w.MaxAttempts, "download attempts per Wasm module (Istio counts them this way too)")
	fs.List(&w.InsecureRegistries, "wasm-insecure-registries", "WASM_INSECURE_REGISTRIES", w.InsecureRegistries, "Wasm module hosts and OCI registries reached over https without verifying their certificate; * for all")
	fs.Int(&w.MaxBytes, "wasm-max-binary-size", "ISTIO_WASM_MAX_BINARY_SIZE_BYTES", w.MaxBytes, "largest Wasm module downloaded, in bytes")
}

func (w Wasm) validate(p *flagenv.Problems) {
	if !w.RemoteLoad {
		return
	}
	if w.Dir == "" {
		p.Addf("-wasm-cache-dir: required with -wasm-remote-load")
	}
	if w.ModuleExpiry <= 0 || w.PurgeInterval <= 0 || w.RequestTimeout <= 0 {
		p.Addf("-wasm-module-expiry, -wasm-purge-interval, -wasm-http-request-timeout: must be positive")
	}
	if w.MaxAttempts < 1 {
		p.Addf("-wasm-http-request-max-retries: %d: at least 1", w.MaxAttempts)
	}
	if w.MaxBytes < 8 {
		p.Addf("-wasm-max-binary-size: %d: at least 8 bytes (a module's header)", w.MaxBytes)
	}
}
