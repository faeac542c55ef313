package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/prometheus/client_golang/prometheus"
)

// Options are the cache's knobs, Istio's agent's WASM_* settings.
type Options struct {
	Dir                string        // where modules are kept (Istio: /var/lib/istio/data)
	ModuleExpiry       time.Duration // WASM_MODULE_EXPIRY: a module unused this long is removed
	PurgeInterval      time.Duration // WASM_PURGE_INTERVAL: how often expired modules are looked for
	RequestTimeout     time.Duration // WASM_HTTP_REQUEST_TIMEOUT: one HTTP attempt
	MaxAttempts        int           // WASM_HTTP_REQUEST_MAX_RETRIES: HTTP attempts per fetch
	InsecureRegistries []string      // WASM_INSECURE_REGISTRIES: hosts fetched without TLS verification; "*": all
	MaxBytes           int64         // ISTIO_WASM_MAX_BINARY_SIZE_BYTES
}

// DefaultOptions are Istio's defaults (pkg/wasm/options.go).
func DefaultOptions(dir string) Options {
	return Options{Dir: dir, ModuleExpiry: 24 * time.Hour, PurgeInterval: time.Hour, RequestTimeout: 15 * time.Second,
		MaxAttempts: 5, MaxBytes: 256 << 20}
}

// PullPolicy is a WasmPlugin's imagePullPolicy, as istiod passes it in the
// VM's ISTIO_META_WASM_IMAGE_PULL_POLICY.
type PullPolicy int

// Istio's pull policies; for an HTTP URL only Always differs: a plugin without
// a checksum is fetched again when its resource version changes.
const (
	PullUnspecified PullPolicy = iota
	PullIfNotPresent
	PullAlways
)

// GetOptions say which module a Get wants.
type GetOptions struct {
	Checksum        string // hex sha256 of the download; empty: whatever the URL serves
	ResourceName    string
	ResourceVersion string
	PullPolicy      PullPolicy
	Timeout         time.Duration // the whole fetch, retries included
}

// moduleKey names a cached module: moduleName of its URL and its checksum.
type moduleKey struct{ name, checksum string }

type module struct {
	path string
	last time.Time
}

// checksumOf is what a URL without a checksum served last, per plugin version.
type checksumOf struct {
	checksum string
	versions map[string]string // resource name → resource version
}

// Cache downloads Wasm modules, checks them and keeps them on disk under
// Dir/<sha256 of URL>/<sha256 of module>.wasm, each written to a temporary file,
// synced and renamed, so a reader (Envoy) never sees part of one.
type Cache struct {
	opts  Options
	fetch *fetcher
	clk   clock.Clock
	log   hclog.Logger
	m     *metrics

	mu        sync.Mutex
	modules   map[moduleKey]*module
	checksums map[string]*checksumOf
}

// NewCache returns a cache; nothing is read or written until Get or Run.
func NewCache(opts Options, clk clock.Clock, reg prometheus.Registerer, log hclog.Logger) (*Cache, error) {
	var errs []error
	if opts.Dir == "" {
		errs = append(errs, errors.New("wasm cache: directory required"))
	}
	if opts.ModuleExpiry <= 0 || opts.PurgeInterval <= 0 || opts.RequestTimeout <= 0 {
		errs = append(errs, errors.New("wasm cache: module expiry, purge interval and request timeout must be positive"))
	}
	if opts.MaxAttempts < 1 || opts.MaxBytes < 8 {
		errs = append(errs, errors.New("wasm cache: at least one attempt and 8 bytes"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Cache{opts: opts, fetch: newFetcher(opts.RequestTimeout, opts.MaxAttempts, opts.MaxBytes, clk), clk: clk,
		log: log, m: m, modules: map[moduleKey]*module{}, checksums: map[string]*checksumOf{}}, nil
}

// Get returns the path of the module at rawURL: from the cache when it holds
// it, else downloaded, checked against o.Checksum (when given), and written to
// disk. On error nothing is written. For an http(s) URL the checksum is the
// download's sha256; for an oci:// image it is the manifest's digest, as in
// Istio's agent, and the module's layer is pulled only when it matches.
func (c *Cache) Get(ctx context.Context, rawURL string, o GetOptions) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("fail to parse Wasm module fetch url: %s, error: %w", rawURL, err)
	}
	switch u.Scheme {
	case "http", "https", "oci":
	default:
		return "", fmt.Errorf("unsupported Wasm module downloading URL scheme: %v", u.Scheme)
	}
	key := moduleKey{name: moduleName(rawURL), checksum: strings.ToLower(o.Checksum)}
	if key.checksum == "" {
		key.checksum = urlDigest(rawURL)
	}
	if p, ok := c.lookup(&key, rawURL, o, ignoresVersion(o.PullPolicy, u)); ok {
		c.m.lookups.WithLabelValues("true").Inc()
		return p, nil
	}
	c.m.lookups.WithLabelValues("false").Inc()

	fctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var got string
	var mod []byte
	var pull func() ([]byte, error)
	if u.Scheme == "oci" {
		img, err := pullManifest(fctx, u.Host+u.Path, c.insecure(u.Host), c.opts.MaxBytes)
		if err != nil {
			c.m.fetches.WithLabelValues("manifest_failure").Inc()
			return "", fmt.Errorf("could not fetch Wasm OCI image: %w", err)
		}
		got, pull = img.digest, img.module
	} else {
		body, err := c.fetch.fetch(fctx, rawURL, c.insecure(u.Host))
		if err != nil {
			c.m.fetches.WithLabelValues("download_failure").Inc()
			return "", err
		}
		sum := sha256.Sum256(body)
		got, mod = hex.EncodeToString(sum[:]), unbox(body, c.opts.MaxBytes)
	}
	if key.checksum == "" {
		// an image seen before under another tag or version: no pull
		key.checksum = got
		if p, ok := c.lookup(&key, rawURL, o, true); ok {
			return p, nil
		}
	} else if got != key.checksum {
		c.m.fetches.WithLabelValues("checksum_mismatch").Inc()
		return "", fmt.Errorf("module downloaded from %v has checksum %v, which does not match: %v", rawURL, got, key.checksum)
	}
	if pull != nil {
		if mod, err = pull(); err != nil {
			c.m.fetches.WithLabelValues("download_failure").Inc()
			return "", fmt.Errorf("could not fetch Wasm binary: %w", err)
		}
	}
	if !isWasm(mod) {
		c.m.fetches.WithLabelValues("invalid").Inc()
		return "", fmt.Errorf("fetched Wasm binary from %s is invalid", rawURL)
	}
	p, err := c.add(key, rawURL, o, mod)
	if err != nil {
		c.m.fetches.WithLabelValues("write_failure").Inc()
		return "", err
	}
	c.m.fetches.WithLabelValues("success").Inc()
	return p, nil
}

// ignoresVersion is Istio's shouldIgnoreResourceVersion: whether a URL
// without a checksum reuses what it served last even when the plugin's version
// changed: not with Always; with no policy, not for an oci:// image tagged
// :latest.
func ignoresVersion(p PullPolicy, u *url.URL) bool {
	switch p {
	case PullAlways:
		return false
	case PullIfNotPresent:
		return true
	}
	return u.Scheme != "oci" || !strings.HasSuffix(u.Path, ":latest")
}

// lookup finds a cached module, filling key.checksum from an earlier download of
// rawURL when none is given (unless the plugin's version changed and the
// version counts).
func (c *Cache) lookup(key *moduleKey, rawURL string, o GetOptions, ignoreVersion bool) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if key.checksum == "" {
		if cs, ok := c.checksums[rawURL]; ok {
			if ignoreVersion || cs.versions[o.ResourceName] == o.ResourceVersion {
				key.checksum = cs.checksum
			}
			cs.versions[o.ResourceName] = o.ResourceVersion
		}
	}
	m, ok := c.modules[*key]
	if !ok {
		return "", false
	}
	m.last = c.clk.Now()
	c.remember(*key, rawURL, o)
	return m.path, true
}

// add writes a checked module and indexes it.
func (c *Cache) add(key moduleKey, rawURL string, o GetOptions, mod []byte) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remember(key, rawURL, o)
	if m, ok := c.modules[key]; ok { // another stream fetched it meanwhile
		m.last = c.clk.Now()
		return m.path, nil
	}
	urlSum := sha256.Sum256([]byte(key.name))
	dir := filepath.Join(c.opts.Dir, hex.EncodeToString(urlSum[:]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("wasm cache: %w", err)
	}
	p := filepath.Join(dir, key.checksum+".wasm")
	if err := atomicfile.Write(p, mod, 0o644); err != nil {
		return "", fmt.Errorf("wasm cache: %w", err)
	}
	c.modules[key] = &module{path: p, last: c.clk.Now()}
	c.m.entries.Set(float64(len(c.modules)))
	c.log.Info("wasm module cached", "url", rawURL, "sha256", key.checksum, "path", p, "bytes", len(mod))
	return p, nil
}

// remember notes what rawURL served, unless the URL pins an image digest.
func (c *Cache) remember(key moduleKey, rawURL string, o GetOptions) {
	if urlDigest(rawURL) != "" {
		return
	}
	cs, ok := c.checksums[rawURL]
	if !ok {
		cs = &checksumOf{versions: map[string]string{}}
		c.checksums[rawURL] = cs
	}
	cs.checksum = key.checksum
	cs.versions[o.ResourceName] = o.ResourceVersion
}

func (c *Cache) insecure(host string) bool {
	for _, h := range c.opts.InsecureRegistries {
		if h == "*" || h == host {
			return true
		}
	}
	return false
}

// Run removes what a crash may have left (temporary files of interrupted
// writes), then every PurgeInterval the modules unused for ModuleExpiry, until
// ctx ends; it returns nil then.
func (c *Cache) Run(ctx context.Context) error {
	c.sweepTemp()
	t := c.clk.NewTimer(c.opts.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			c.Purge()
			t.Reset(c.opts.PurgeInterval)
		}
	}
}

// Purge removes the modules unused for ModuleExpiry.
func (c *Cache) Purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for k, m := range c.modules {
		if now.Sub(m.last) <= c.opts.ModuleExpiry {
			continue
		}
		if err := os.Remove(m.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			c.log.Warn("purge wasm module", "path", m.path, "error", err)
			continue
		}
		delete(c.modules, k)
		for u, cs := range c.checksums {
			if cs.checksum == k.checksum && moduleName(u) == k.name {
				delete(c.checksums, u)
			}
		}
		c.log.Info("wasm module purged", "module", k.name, "sha256", k.checksum)
	}
	c.m.entries.Set(float64(len(c.modules)))
}

// sweepTemp removes atomicfile's temporary files (".<name>.<random>") under Dir.
func (c *Cache) sweepTemp() {
	dirs, err := os.ReadDir(c.opts.Dir)
	if err != nil {
		return
	}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(c.opts.Dir, d.Name()))
		if err != nil {
			continue
		}
		for _, f := range files {
			if strings.HasPrefix(f.Name(), ".") && !f.IsDir() {
				p := filepath.Join(c.opts.Dir, d.Name(), f.Name())
				if err := os.Remove(p); err == nil {
					c.log.Info("removed an interrupted wasm download", "path", p)
				}
			}
		}
	}
}

type metrics struct {
	fetches, lookups *prometheus.CounterVec
	entries          prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_wasm_fetches_total",
			Help: "Wasm module downloads, by result (Istio: istio_agent_wasm_remote_fetch_count)."}, []string{"result"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_wasm_cache_lookups_total",
			Help: "Wasm module cache lookups, by hit (Istio: istio_agent_wasm_cache_lookup_count)."}, []string{"hit"}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshagent_xds_relay_wasm_cache_entries",
			Help: "Wasm modules in the cache (Istio: istio_agent_wasm_cache_entries)."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.fetches, m.lookups, m.entries} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("wasm metrics: %w", err)
			}
		}
	}
	return m, nil
}

// pullPolicy reads ISTIO_META_WASM_IMAGE_PULL_POLICY's value.
func pullPolicy(s string) PullPolicy {
	switch s {
	case "IfNotPresent":
		return PullIfNotPresent
	case "Always":
		return PullAlways
	}
	return PullUnspecified
}
