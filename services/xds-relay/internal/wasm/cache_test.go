package wasm

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/prometheus/client_golang/prometheus"
)

var wasmModule = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// served is a real HTTP server of one body, counting downloads.
type served struct {
	*httptest.Server
	mu   sync.Mutex
	body []byte
	n    int
}

func serve(t *testing.T, body []byte) *served {
	s := &served{body: body}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.n++
		_, _ = w.Write(s.body)
	}))
	t.Cleanup(func() { s.CloseClientConnections(); s.Close() })
	return s
}

func (s *served) downloads() int { s.mu.Lock(); defer s.mu.Unlock(); return s.n }

func newTestCache(t *testing.T, clk clock.Clock) *Cache {
	t.Helper()
	o := DefaultOptions(t.TempDir())
	o.MaxAttempts = 1
	c, err := NewCache(o, clk, prometheus.NewRegistry(), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A URL without a checksum is fetched once and reused; with pull policy Always a
// new resource version fetches it again (Istio's cache semantics); a gzip box is
// opened, the checksum being the download's.
func TestCacheWithoutChecksumFollowsThePullPolicy(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(wasmModule)
	_ = zw.Close()
	s := serve(t, gz.Bytes())
	c := newTestCache(t, clock.Real{})
	ctx := context.Background()
	get := func(policy PullPolicy, version string) string {
		t.Helper()
		p, err := c.Get(ctx, s.URL+"/m.wasm", GetOptions{ResourceName: "ns.p", ResourceVersion: version, PullPolicy: policy, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := get(PullUnspecified, "1")
	if b, _ := os.ReadFile(p); !bytes.Equal(b, wasmModule) || filepath.Base(p) != sum(gz.Bytes())+".wasm" {
		t.Fatalf("cached %s: %x, want the unboxed module named by the download's sha256", p, b)
	}
	get(PullUnspecified, "2")
	get(PullIfNotPresent, "3")
	if n := s.downloads(); n != 1 {
		t.Fatalf("%d downloads, want 1 (reused)", n)
	}
	get(PullAlways, "3") // same version: reused
	if n := s.downloads(); n != 1 {
		t.Fatalf("%d downloads after Always at the same version, want 1", n)
	}
	get(PullAlways, "4")
	if n := s.downloads(); n != 2 {
		t.Fatalf("%d downloads after Always at a new version, want 2", n)
	}
}

// Run removes the temporary files of an interrupted write and keeps complete
// modules; Purge removes a module unused past the expiry, not one in use.
func TestCacheSweepsAndPurges(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	s := serve(t, wasmModule)
	c := newTestCache(t, clk)
	p, err := c.Get(context.Background(), s.URL+"/m.wasm", GetOptions{Checksum: sum(wasmModule), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".123456")
	if err := os.WriteFile(stale, wasmModule[:3], 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testkit.Eventually(t, "the interrupted write removed", func() bool { _, err := os.Stat(stale); return os.IsNotExist(err) })
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the complete wasmModule went too: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	clk.Add(23 * time.Hour)
	c.Purge()
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("a wasmModule used 23 h ago was purged: %v", err)
	}
	clk.Add(2 * time.Hour)
	c.Purge()
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("a wasmModule unused for 25 h is still there: %v", err)
	}
	if _, err := c.Get(context.Background(), s.URL+"/m.wasm", GetOptions{Checksum: sum(wasmModule), Timeout: 5 * time.Second}); err != nil || s.downloads() != 2 {
		t.Fatalf("after the purge: %v, %d downloads, want it fetched again", err, s.downloads())
	}
}

// Bad options are reported together and build nothing.
func TestNewCacheRejectsBadOptions(t *testing.T) {
	_, err := NewCache(Options{}, clock.Real{}, nil, hclog.NewNullLogger())
	if err == nil {
		t.Fatal("empty options accepted")
	}
	for _, want := range []string{"directory required", "must be positive", "at least one attempt"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
