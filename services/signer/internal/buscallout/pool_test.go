package buscallout

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// countingVerifier is the real JWT verifier, counted, optionally slowed (a
// TokenReview waiting on the API server) or held until released.
type countingVerifier struct {
	Verifier
	calls atomic.Int64
	delay time.Duration
	hold  chan struct{} // not nil: every Verify waits until it is closed
	held  atomic.Int64
}

func (v *countingVerifier) Verify(token string) (authn.Caller, error) {
	v.calls.Add(1)
	if v.hold != nil {
		v.held.Add(1)
		<-v.hold
	}
	if v.delay > 0 {
		time.Sleep(v.delay)
	}
	return v.Verifier.Verify(token)
}

// startTuned runs a responder with capacity c and a counted verifier.
func startTuned(t *testing.T, c Capacity, v *countingVerifier) *fixture {
	t.Helper()
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	v.Verifier = &authn.JWTVerifier{Keys: authn.StaticKeySet(iss.JWKS()), Issuer: "meshagent-dev", Audience: "istio-ca", TrustDomain: "cluster.local"}
	srv := bustest.SecureServer(t)
	issuer, err := policy.ReadSeed(srv.Creds.IssuerFile(), nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context) (*nats.Conn, error) {
		return nats.Connect(srv.Server.ClientURL(), srv.RoleOptions(t, policy.Callout)...)
	}
	r := New(issuer, v, nil, dial, prometheus.NewRegistry(), hclog.NewNullLogger(), clock.Real{}).Tune(c)
	stop := testkit.Background(t, r.Run)
	t.Cleanup(stop)
	testkit.EventuallyWithin(t, 10*time.Second, "callout ready", func() bool { return r.Ready() == nil })
	return &fixture{srv: srv, iss: iss, r: r}
}

// A storm far beyond what the callout can take at once: 150 pods with two
// connections each all connect together, through bus.Connect (the services'
// client, with its jittered backoff), against two workers slowed to 3 ms a token
// and a queue of 8. The callout sheds what it cannot queue as busy instead of
// letting it time out, and every client is admitted; admissions spent on clients
// the server had given up on stay well below a collapse's.
func TestStormEveryClientAdmittedWithoutCollapse(t *testing.T) {
	v := &countingVerifier{delay: 3 * time.Millisecond}
	f := startTuned(t, Capacity{Workers: 2, Queue: 8}, v)
	const pods, perPod = 150, 2
	dir := t.TempDir()
	now := time.Now()
	var wg sync.WaitGroup
	var connected atomic.Int64
	errs := make(chan error, pods*perPod)
	conns := make(chan *nats.Conn, pods*perPod)
	for i := range pods {
		name := fmt.Sprintf("web-%d", i)
		file := filepath.Join(dir, name)
		tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod(name))
		if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		ref := events.PodRef{Namespace: "default", Name: name}
		for range perPod {
			wg.Add(1)
			go func() {
				defer wg.Done()
				nc, err := bus.Connect(context.Background(), bus.Config{URL: f.srv.Server.ClientURL(), TokenFile: file, Pod: ref.String(),
					InboxPrefix: policy.Inbox(policy.Pod, ref), ConnectWait: 60 * time.Second}, hclog.NewNullLogger())
				if err != nil {
					errs <- err
					return
				}
				connected.Add(1)
				conns <- nc
			}()
		}
	}
	wg.Wait()
	close(errs)
	close(conns)
	for nc := range conns {
		t.Cleanup(nc.Close)
	}
	for err := range errs {
		t.Errorf("pod not admitted: %v", err)
	}
	n := float64(pods * perPod)
	if got := float64(connected.Load()); got != n {
		t.Fatalf("%v of %v connections made", got, n)
	}
	admitted := testutil.ToFloat64(f.r.admitted)
	busy := testutil.ToFloat64(f.r.refused.WithLabelValues(ReasonBusy))
	dropped := testutil.ToFloat64(f.r.dropped)
	hits := testutil.ToFloat64(f.r.cacheHits)
	t.Logf("admitted=%v busy=%v dropped=%v verified=%d cache_hits=%v", admitted, busy, dropped, v.calls.Load(), hits)
	// Exactly n when the machine keeps up. A server starved of CPU (this test
	// beside other packages' under -race) can deliver a request, or take in its
	// answer, after its own 2 s have passed, which the callout cannot see: the
	// client is told no and admitted again (measured up to 1.6 n here). A
	// collapse admits many times n (issue 26: 167,105 admissions for 6,000
	// connections), and goodput falls: below 2 n, every client still got in.
	if admitted < n || admitted >= 2*n {
		t.Errorf("admitted %v connections for %v clients: admissions were spent on clients that had gone", admitted, n)
	}
	if busy == 0 {
		t.Errorf("no request shed as busy with a queue of 8 and %v clients at once", n)
	}
	if hits == 0 || float64(v.calls.Load()) >= n+busy {
		t.Errorf("tokens verified %d times for %v admissions with %v cache hits: a pod's second connection should reuse its token's check", v.calls.Load(), admitted, hits)
	}
}

// A client whose connect request the callout reaches only after the server gave
// up on it (a TokenReview that took too long) is not admitted: no answer is sent,
// the pod's admission is not counted, and the client heard of its failure from the
// server before its own connect timeout (server auth timeout < client timeout).
func TestClientGivenUpOnIsNotAdmitted(t *testing.T) {
	v := &countingVerifier{hold: make(chan struct{})}
	f := startTuned(t, Capacity{Workers: 2, Queue: 8}, v)
	tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", time.Now().Add(-time.Minute), time.Hour).ForPod("slow-1"))
	start := time.Now()
	nc, err := f.connect("slow-1", tok, nats.Timeout(bus.ConnectTimeout))
	if err == nil {
		nc.Close()
		t.Fatal("admitted while its token was still being checked")
	}
	if took := time.Since(start); took >= bus.ConnectTimeout {
		t.Fatalf("the client waited %s, its whole connect timeout: the server's auth timeout (%s) must end first", took, policy.AuthTimeout)
	}
	if v.held.Load() != 1 {
		t.Fatalf("verifier reached %d times, want 1", v.held.Load())
	}
	close(v.hold)
	testkit.EventuallyWithin(t, 10*time.Second, "request dropped", func() bool { return testutil.ToFloat64(f.r.dropped) == 1 })
	if got := testutil.ToFloat64(f.r.admitted); got != 0 {
		t.Fatalf("admitted = %v for a client that had gone", got)
	}
	f.r.admissions.mu.Lock()
	held := len(f.r.admissions.pods["default/slow-1"])
	f.r.admissions.mu.Unlock()
	if held != 0 {
		t.Fatalf("pod default/slow-1 has %d admissions counted for a connection it never got", held)
	}
}

// A pod's connections share one verification of its token while it is cached; a
// refused token is never cached (checked again every time); another token of the
// same pod is verified on its own.
func TestTokenVerifiedOncePerPod(t *testing.T) {
	v := &countingVerifier{}
	f := startTuned(t, Capacity{}, v)
	now := time.Now()
	tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod("web-1"))
	for range 3 {
		nc, err := f.connect("web-1", tok)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
	}
	if got := v.calls.Load(); got != 1 {
		t.Fatalf("one pod's token verified %d times for 3 connections", got)
	}
	if got := testutil.ToFloat64(f.r.cacheHits); got != 2 {
		t.Fatalf("cache hits = %v, want 2", got)
	}
	stranger := tokentest.NewIssuer(t, "meshagent-dev")
	bad := stranger.Mint(t, stranger.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod("web-1"))
	for range 2 {
		if nc, err := f.connect("web-1", bad); err == nil {
			nc.Close()
			t.Fatal("a token of an unknown key admitted")
		}
	}
	if got := v.calls.Load(); got != 3 {
		t.Fatalf("verified %d times after two bad tokens, want 3 (refusals are not cached)", got)
	}
	other := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Second), time.Hour).ForPod("web-1"))
	nc, err := f.connect("web-1", other)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := v.calls.Load(); got != 4 {
		t.Fatalf("verified %d times after a second token, want 4", got)
	}
	if got := testutil.ToFloat64(f.r.admitted); got != 4 {
		t.Fatalf("admitted = %v, want 4", got)
	}
}

func TestTokenCacheBoundedAndExpiring(t *testing.T) {
	now := time.Now()
	c := newTokenCache(3, time.Minute)
	caller := authn.Caller{Expires: now.Add(time.Hour)}
	for i := range 10 {
		c.put(fmt.Sprint("tok-", i), caller, now)
	}
	if c.len() != 3 {
		t.Fatalf("cache holds %d tokens, bound 3", c.len())
	}
	c = newTokenCache(10, time.Minute)
	c.put("short", authn.Caller{Expires: now.Add(time.Second)}, now)
	c.put("long", caller, now)
	if _, ok := c.get("short", now.Add(2*time.Second)); ok {
		t.Fatal("a token served from the cache past its expiry")
	}
	if _, ok := c.get("long", now.Add(30*time.Second)); !ok {
		t.Fatal("a fresh token missing from the cache")
	}
	if _, ok := c.get("long", now.Add(2*time.Minute)); ok {
		t.Fatal("a token served from the cache past the cache's TTL")
	}
	c.put("gone", authn.Caller{Expires: now.Add(-time.Second)}, now)
	if _, ok := c.get("gone", now); ok {
		t.Fatal("an expired token cached")
	}
}

// The deadline counts the request's own lifetime (whole seconds of the server's
// clock, less one for their rounding, at least half a second) from its arrival on
// this clock, whatever the two clocks say; no expiry, no deadline.
func TestRequestDeadline(t *testing.T) {
	arrived := time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)
	skewed := arrived.Add(-time.Hour).Unix() // the server's clock an hour behind
	tests := []struct {
		name        string
		issued, exp int64
		want        time.Duration
	}{
		{"three seconds", skewed, skewed + 3, 2 * time.Second},
		{"two seconds", skewed, skewed + 2, time.Second},
		{"rounded to one", skewed, skewed + 1, 500 * time.Millisecond},
		{"no expiry", skewed, 0, 0},
		{"expiry before issue", skewed, skewed - 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := jwt.NewAuthorizationRequestClaims("UABC")
			req.IssuedAt, req.Expires = tc.issued, tc.exp
			got := deadline(req, arrived)
			if tc.want == 0 {
				if !got.IsZero() {
					t.Fatalf("deadline %s, want none", got)
				}
				return
			}
			if got.Sub(arrived) != tc.want {
				t.Fatalf("deadline %s after arrival, want %s", got.Sub(arrived), tc.want)
			}
		})
	}
}
