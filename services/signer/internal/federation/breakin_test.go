package federation

import (
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Break-in tests of the follower: a followed endpoint (or whoever holds its name)
// is an attacker. Each test asserts on what the follower holds and announced
// for the domain, not only on the error it shows.

var east = spiffeid.RequireTrustDomainFromString("east.example")

// announcements records what OnBundle was handed, per domain: what the signer
// would have announced to the fleet.
type announcements struct {
	mu    sync.Mutex
	count map[string]int
	last  map[string]*spiffebundle.Bundle
}

func (a *announcements) onBundle(td spiffeid.TrustDomain, b *spiffebundle.Bundle, _ Status) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.count == nil {
		a.count, a.last = map[string]int{}, map[string]*spiffebundle.Bundle{}
	}
	a.count[td.Name()]++
	a.last[td.Name()] = b
	return nil
}

func (a *announcements) of(td string) (int, *spiffebundle.Bundle) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.count[td], a.last[td]
}

// switchable serves whatever handler it holds now.
type switchable struct{ h atomic.Pointer[http.Handler] }

func (s *switchable) set(h http.Handler) { s.h.Store(&h) }
func (s *switchable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// endless writes an endless body of 'a's (chunked, no Content-Length) and
// counts the bytes the client took.
func endless(written *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := []byte(strings.Repeat("a", 32<<10))
		for r.Context().Err() == nil {
			n, err := w.Write(buf)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
}

// statusOf is the follower's status of td, or a zero Status.
func statusOf(f *Follower, td string) Status {
	for _, s := range f.Status() {
		if s.TrustDomain == td {
			return s
		}
	}
	return Status{}
}

func webRootsOf(srvs ...*httptest.Server) *x509.CertPool {
	p := x509.NewCertPool()
	for _, s := range srvs {
		p.AddCert(s.Certificate())
	}
	return p
}

// A followed endpoint that turns hostile and answers an endless body is
// refused at the size limit: the domain keeps the bundle it had (nothing new is
// held or announced), shows the error with reason too_large, and the follower
// reads about the limit, not the body (the heap does not grow by it).
func TestBreakInEndlessBundleRefused(t *testing.T) {
	west := newDomain(t, "west.example", time.Second)
	h, _ := Handler(west.td, west.current, time.Second)
	var sw switchable
	sw.set(h)
	srv := httptest.NewTLSServer(&sw)
	t.Cleanup(srv.Close)
	var ann announcements
	const limit = 64 << 10
	f := running(t, Config{Self: east, WebPKIRoots: webRootsOf(srv), MinRefresh: 20 * time.Millisecond, MaxRefresh: 50 * time.Millisecond,
		MaxBundleSize: limit, OnBundle: ann.onBundle}, []Source{{TrustDomain: west.td, URL: srv.URL}})
	testkit.Eventually(t, "west's good bundle followed", func() bool { n, _ := ann.of("west.example"); return n > 0 })
	roots, _ := west.current()

	var written atomic.Int64
	sw.set(endless(&written))
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	bad := time.Now()
	testkit.Eventually(t, "endless bundle refused three times", func() bool {
		st := statusOf(f, "west.example")
		return st.Errors[ReasonTooLarge] >= 3 && st.LastErrAt.After(bad)
	})
	n, _ := ann.of("west.example")
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	st := statusOf(f, "west.example")
	if st.ErrReason != ReasonTooLarge || !strings.Contains(st.Err, "larger than 65536 bytes") || !strings.Contains(st.Err, "-spiffe-bundle-max-size") {
		t.Fatalf("status = %+v", st)
	}
	// The bundle held is still the last good one, from before.
	b, ok := f.Bundles().Get(west.td)
	if !ok || len(b.X509Authorities()) != 1 || !b.HasX509Authority(roots[0]) || st.Roots != 1 || st.FetchedAt.After(bad) {
		t.Fatalf("held bundle changed: ok=%v status=%+v", ok, st)
	}
	// Nothing was announced since: give the follower three more rounds.
	refusals := st.Errors[ReasonTooLarge]
	testkit.Eventually(t, "three more refusals", func() bool { return statusOf(f, "west.example").Errors[ReasonTooLarge] >= refusals+3 })
	if m, _ := ann.of("west.example"); m != n {
		t.Fatalf("announced %d more times while the endpoint served an endless body", m-n)
	}
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("endless body: the server wrote %d bytes into the connections (socket buffers) over %d refusals, the follower read at most 64 KiB+1 of each; heap %d -> %d bytes (%+d), total allocated %d bytes",
		written.Load(), refusals, before.HeapAlloc, after.HeapAlloc, growth, after.TotalAlloc-before.TotalAlloc)
	// Loose: a follower that read the body would hold far more than this.
	if growth > 32<<20 {
		t.Fatalf("heap grew by %d bytes while refusing an endless body", growth)
	}
}

// A domain whose endpoint declares (Content-Length) or sends a bundle over the
// limit from its first fetch is never trusted: nothing is held or announced,
// and its status names the reason.
func TestBreakInOversizedBundleNeverTrusted(t *testing.T) {
	west := newDomain(t, "west.example", time.Second)
	roots, gen := west.current()
	good, err := BundleOf(west.td, roots, gen, time.Second).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"declared 300 MB", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(300<<20))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(good) // then hangs up: the follower must not wait for the rest
		}},
		{"a valid bundle padded past the limit", func(w http.ResponseWriter, r *http.Request) {
			// JSON allows the padding: only the size is wrong.
			_, _ = w.Write(append(append([]byte{}, good[:len(good)-1]...), []byte(`,"pad":"`+strings.Repeat("x", 4<<10)+`"}`)...))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(tc.h)
			t.Cleanup(srv.Close)
			var ann announcements
			f := running(t, Config{Self: east, WebPKIRoots: webRootsOf(srv), MinRefresh: 20 * time.Millisecond,
				MaxBundleSize: int64(len(good) + 1024), OnBundle: ann.onBundle}, []Source{{TrustDomain: west.td, URL: srv.URL}})
			testkit.Eventually(t, "refused twice", func() bool { return statusOf(f, "west.example").Errors[ReasonTooLarge] >= 2 })
			st := statusOf(f, "west.example")
			if _, held := f.Bundles().Get(west.td); held || st.Roots != 0 || !st.FetchedAt.IsZero() || st.ErrReason != ReasonTooLarge {
				t.Fatalf("an oversized bundle was taken: held=%v status=%+v", held, st)
			}
			if n, _ := ann.of("west.example"); n != 0 {
				t.Fatalf("announced %d times", n)
			}
		})
	}
}

// Static bundle files have the same bound: an endless file (/dev/zero) or one
// over the limit is refused without being read whole, and nothing is held.
func TestBreakInOversizedBundleFileRefused(t *testing.T) {
	west := spiffeid.RequireTrustDomainFromString("west.example")
	big := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(big, []byte(`{"keys":[],"pad":"`+strings.Repeat("x", 8<<10)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", big} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			if _, err := os.Stat(path); err != nil {
				t.Skip(err)
			}
			var ann announcements
			f := running(t, Config{Self: east, MinRefresh: 20 * time.Millisecond, MaxBundleSize: 4 << 10, OnBundle: ann.onBundle},
				[]Source{{TrustDomain: west, File: path}})
			testkit.Eventually(t, "file refused", func() bool { return statusOf(f, "west.example").Errors[ReasonTooLarge] >= 2 })
			if _, held := f.Bundles().Get(west); held {
				t.Fatal("an oversized bundle file was taken")
			}
			if n, _ := ann.of("west.example"); n != 0 {
				t.Fatalf("announced %d times", n)
			}
		})
	}
}

// counting is a server that counts the requests it gets: a redirect's target.
func counting(hits *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, `{"keys":[]}`)
	})
}

// A followed endpoint that redirects — to plain http on an internal address
// (blind SSRF at every refresh), or to another HTTPS host, even one serving a
// valid bundle of the domain — is refused: the target is never contacted,
// the domain keeps what it had, and its status says redirect.
func TestBreakInRedirectsRefused(t *testing.T) {
	west := newDomain(t, "west.example", time.Second)
	roots, _ := west.current()
	var internalHits, otherHits atomic.Int64
	internal := httptest.NewServer(counting(&internalHits)) // plain http: "an internal URL"
	t.Cleanup(internal.Close)
	otherHandler, _ := Handler(west.td, west.current, time.Second)
	other := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherHits.Add(1)
		otherHandler.ServeHTTP(w, r)
	}))
	t.Cleanup(other.Close)

	for _, tc := range []struct {
		name, target string
		hits         *atomic.Int64
	}{
		{"https to http", internal.URL + "/latest/meta-data/", &internalHits},
		{"https to another https host", other.URL + "/bundle", &otherHits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := Handler(west.td, west.current, time.Second)
			var sw switchable
			sw.set(h)
			srv := httptest.NewTLSServer(&sw)
			t.Cleanup(srv.Close)
			var ann announcements
			f := running(t, Config{Self: east, WebPKIRoots: webRootsOf(srv, other), MinRefresh: 20 * time.Millisecond, MaxRefresh: 50 * time.Millisecond,
				OnBundle: ann.onBundle}, []Source{{TrustDomain: west.td, URL: srv.URL}})
			testkit.Eventually(t, "good bundle followed", func() bool { n, _ := ann.of("west.example"); return n > 0 })
			n, _ := ann.of("west.example")
			before := tc.hits.Load()

			for _, code := range []int{http.StatusFound, http.StatusPermanentRedirect} {
				sw.set(http.RedirectHandler(tc.target, code))
				seen := statusOf(f, "west.example").Errors[ReasonRedirect]
				testkit.Eventually(t, fmt.Sprintf("redirect %d refused twice", code), func() bool {
					return statusOf(f, "west.example").Errors[ReasonRedirect] >= seen+2
				})
			}
			st := statusOf(f, "west.example")
			if got := tc.hits.Load(); got != before {
				t.Fatalf("the redirect target was contacted %d times", got-before)
			}
			if st.ErrReason != ReasonRedirect || !strings.Contains(st.Err, "redirect refused") || !strings.Contains(st.Err, tc.target) {
				t.Fatalf("status = %+v", st)
			}
			b, ok := f.Bundles().Get(west.td)
			if !ok || !b.HasX509Authority(roots[0]) || len(b.X509Authorities()) != 1 {
				t.Fatalf("held bundle changed: %v", ok)
			}
			if m, _ := ann.of("west.example"); m != n {
				t.Fatalf("announced %d times from a redirecting endpoint", m-n)
			}
		})
	}
}

// A domain whose endpoint answers another status than 200 (with a body that
// would parse) or a bundle of no X.509 roots is refused with its reason.
func TestBreakInNon200AndEmptyBundles(t *testing.T) {
	west := newDomain(t, "west.example", time.Second)
	roots, gen := west.current()
	good, _ := BundleOf(west.td, roots, gen, time.Second).Marshal()
	for _, tc := range []struct {
		name, reason string
		h            http.HandlerFunc
	}{
		{"500 with a bundle", ReasonHTTPStatus, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write(good)
		}},
		{"no roots", ReasonNoRoots, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{"keys":[]}`) }},
		{"not a bundle", ReasonParse, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `<html>login</html>`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(tc.h)
			t.Cleanup(srv.Close)
			var ann announcements
			f := running(t, Config{Self: east, WebPKIRoots: webRootsOf(srv), MinRefresh: 20 * time.Millisecond, OnBundle: ann.onBundle},
				[]Source{{TrustDomain: west.td, URL: srv.URL}})
			testkit.Eventually(t, "refused: "+tc.reason, func() bool { return statusOf(f, "west.example").Errors[tc.reason] >= 2 })
			if _, held := f.Bundles().Get(west.td); held {
				t.Fatal("bundle taken")
			}
			if n, _ := ann.of("west.example"); n != 0 {
				t.Fatalf("announced %d times", n)
			}
		})
	}
}

// A bundle that was fetched but could not be announced (too large for an
// event, the bus down) is not held, and the domain shows the failure with
// reason announce: a domain refused this way is visible, not only logged.
func TestBreakInUnannouncedBundleNotHeld(t *testing.T) {
	west := newDomain(t, "west.example", time.Second)
	var refused, failures, firsts atomic.Int64
	f := running(t, Config{Self: east, WebPKIRoots: webRootsOf(west.endpoint), MinRefresh: 20 * time.Millisecond,
		OnBundle: func(spiffeid.TrustDomain, *spiffebundle.Bundle, Status) error {
			refused.Add(1)
			return fmt.Errorf("event too large")
		},
		OnFailure: func(_ spiffeid.TrustDomain, st Status, first bool) {
			failures.Add(1)
			if first {
				firsts.Add(1)
			}
		}}, []Source{{TrustDomain: west.td, URL: west.endpoint.URL}})
	testkit.Eventually(t, "announce failures shown", func() bool { return failures.Load() >= 3 })
	st := statusOf(f, "west.example")
	if firsts.Load() != 1 {
		t.Errorf("%d failures reported as the first of a run", firsts.Load())
	}
	if _, held := f.Bundles().Get(west.td); held || !st.FetchedAt.IsZero() || st.Roots != 0 ||
		st.ErrReason != ReasonAnnounce || !strings.Contains(st.Err, "not announced: event too large") {
		t.Fatalf("held=%v status=%+v", held, st)
	}
}

// Trust domain names are taken only in their canonical form: a trailing dot,
// a scheme, a port, a path, an empty label name a second domain beside the one
// meant (cluster.local. beside home cluster.local) and are refused, naming
// the entry; upper case is folded. The home domain and its aliases are never
// followed, however written.
func TestBreakInTrustDomainNames(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"cluster.local.", "no trailing dot"},
		{"spiffe://west.example", "no scheme"},
		{"https://west.example", "no scheme"},
		{"west.example:8443", "no port"},
		{"west.example/x", "no path"},
		{"west..example", "empty label"},
		{".west.example", "empty label"},
		{"west example", "trust domain characters are limited"},
		{strings.Repeat("a", 256), "SPIFFE allows 255"},
	} {
		if _, err := ParseEndpoints(tc.in + "|https://w/b"); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "entry 1") {
			t.Errorf("ParseEndpoints(%q): %v, want %q", tc.in, err, tc.want)
		}
		if _, err := ParseFiles(tc.in + "|/b.json"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFiles(%q): %v, want %q", tc.in, err, tc.want)
		}
	}
	got, err := ParseEndpoints(" West.EXAMPLE |https://w/b")
	if err != nil || len(got) != 1 || got[0].TrustDomain.Name() != "west.example" {
		t.Fatalf("upper case not folded: %+v, %v", got, err)
	}
	if _, err := ParseEndpoints("West.example|https://w/b||west.example|https://x/b"); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("one domain in two spellings: %v", err)
	}

	// The follower itself refuses home and alias, and leaves what it follows alone.
	alias := spiffeid.RequireTrustDomainFromString("mesh.internal")
	f, err := NewFollower(Config{Self: east, Aliases: []spiffeid.TrustDomain{alias}}, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	west := Source{TrustDomain: spiffeid.RequireTrustDomainFromString("west.example"), URL: "https://w/b"}
	if err := f.Follow([]Source{west}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Source{
		{TrustDomain: alias, URL: "https://m/b"},
		{TrustDomain: east, URL: "https://e/b"},
		{TrustDomain: spiffeid.RequireTrustDomainFromString("east.example."), URL: "https://e/b"}, // go-spiffe takes it
	} {
		if err := f.Follow([]Source{west, bad}); err == nil {
			t.Errorf("Follow(%s) accepted", bad.TrustDomain)
		}
	}
	if st := f.Status(); len(st) != 1 || st[0].TrustDomain != "west.example" {
		t.Fatalf("refused input changed what is followed: %+v", st)
	}
}
