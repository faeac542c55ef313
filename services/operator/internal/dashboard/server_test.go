package dashboard

import (
	"bufio"
	"context"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestPageAssetsAreSelfContained: nothing the page loads comes from another origin.
func TestPageAssetsAreSelfContained(t *testing.T) {
	n := 0
	err := fs.WalkDir(web, "web", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := web.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(data), "://") {
			t.Errorf("%s names another origin", path)
		}
		n++
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("walked %d files: %v", n, err)
	}
}

// getWithHost GETs url with the Host header host; the body is cut at 64 KiB (the
// event feed never ends).
func getWithHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	n, _ := io.ReadAtLeast(resp.Body, buf, 1)
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		rest, _ := io.ReadAll(io.LimitReader(resp.Body, int64(len(buf)-n)))
		return resp.StatusCode, string(buf[:n]) + string(rest)
	}
	return resp.StatusCode, string(buf[:n])
}

func portOf(a net.Addr) string {
	_, p, _ := net.SplitHostPort(a.String())
	return p
}

// The Host names a dashboard answers, by the address it listens on.
func TestHostGuard(t *testing.T) {
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	for _, c := range []struct {
		name   string
		listen string
		bound  net.Addr
		extra  []string
		ok     []string
		refuse []string
	}{
		{"loopback", "127.0.0.1:9080", tcp("127.0.0.1:9080"), nil,
			[]string{"127.0.0.1:9080", "127.0.0.1", "localhost:9080", "LocalHost", "[::1]:9080", "127.0.0.2"},
			[]string{"evil.example:9080", "evil.example", "", "10.0.0.1:9080", "localhost.evil.example", "127.0.0.1.nip.io"}},
		{"a name given", "dash.corp.example:9080", tcp("10.1.2.3:9080"), []string{"Dashboard.Example"},
			[]string{"dash.corp.example:9080", "DASH.corp.example.", "10.1.2.3", "dashboard.example:443"},
			[]string{"localhost", "127.0.0.1", "10.1.2.4", "evil.example", "corp.example"}},
		{"every address", ":9080", tcp("[::]:9080"), nil,
			[]string{"localhost", "10.9.8.7:9080", "[fd00::1]:9080", "127.0.0.1"},
			[]string{"evil.example", "meshctl-serve.mesh.svc"}},
		{"ipv6 loopback", "[::1]:0", tcp("[::1]:43210"), nil,
			[]string{"[::1]:43210", "localhost"},
			[]string{"evil.example", "[fd00::1]:43210"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newHostGuard(c.listen, c.bound, c.extra, http.NotFoundHandler())
			for _, h := range c.ok {
				if !g.allowed(h) {
					t.Errorf("%q refused", h)
				}
			}
			for _, h := range c.refuse {
				if g.allowed(h) {
					t.Errorf("%q allowed", h)
				}
			}
		})
	}
}

func TestExpiryBuckets(t *testing.T) {
	for left, want := range map[time.Duration]string{-time.Second: "expired", 0: "expired", time.Minute: "1h", 2 * time.Hour: "6h",
		23 * time.Hour: "24h", 3 * 24 * time.Hour: "7d", 20 * 24 * time.Hour: "30d", 400 * 24 * time.Hour: "later"} {
		if got := ExpiryBucket(left); got != want {
			t.Errorf("%s: %s, want %s", left, got, want)
		}
	}
}

// TestServeKeepsAndShowsTheFleet: the dashboard on the secured bus, as the inventory
// role, mounted on an obs server as the operator service mounts it, folds a certificate into the inventory, serves it as JSON, counts it in the
// metrics, streams it over server-sent events and writes it to the audit file.
func TestServeKeepsAndShowsTheFleet(t *testing.T) {
	m := bustest.SecureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	if _, err := bus.EnsureEventStream(ctx, bustest.JetStream(t, signer), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "audit.jsonl")
	sink, err := auditlog.NewSink(file, 1<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	var errs bustest.Errors
	hs := obs.NewServer("127.0.0.1:0", hclog.NewNullLogger())
	s, err := New(Config{Metrics: hs.Registry(), Sink: sink, Listen: "127.0.0.1:0"}, m.Conn(t, policy.Inventory, &errs), clock.Real{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	hs.Handle("/", s.Handler())
	hs.Use(s.Guard)
	hs.AddReadyCheck("inventory", s.Ready)
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- lifecycle.Tasks(sctx, hs.Run, s.Run) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case <-hs.Bound():
	case err := <-done:
		t.Fatal(err)
	}
	base := "http://" + hs.Addr().String()
	testkit.Eventually(t, "serve ready", func() bool { code, _ := testkit.HTTPGet(base + "/readyz"); return code == 200 })

	now := time.Now()
	msg, err := events.NewMsg(events.SubjectCertIssued, "signer-0", events.CertIssued{Serial: "5e41a1", SPIFFEID: "spiffe://td/ns/a/sa/web",
		NotBefore: now, NotAfter: now.Add(30 * time.Minute), Pod: events.PodRef{Namespace: "default", Name: "web-0"}, KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Publish(ctx, bustest.JetStream(t, signer), msg); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the inventory API lists web-0", func() bool {
		code, body := testkit.HTTPGet(base + "/api/inventory")
		return code == 200 && strings.Contains(body, `"serial":"5e41a1"`) && strings.Contains(body, `"pod":"default/web-0"`)
	})
	var metrics string
	if !testkit.Poll(testkit.Timeout, func() bool {
		_, metrics = testkit.HTTPGet(base + "/metrics")
		return strings.Contains(metrics, `meshagent_fleet_certificates{expires_in="1h"} 1`) &&
			strings.Contains(metrics, `meshagent_fleet_certs_issued_total{signer="signer-0"} 1`)
	}) {
		t.Fatalf("the metrics do not count it:\n%s", metrics)
	}
	// A malformed record written with the inventory credential: the page and the
	// metrics still show web-0, and say one record was skipped.
	if _, err := s.keeper.Bucket().Put(ctx, "pod.evil.64656661756c74", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the API lists web-0 and the skipped record", func() bool {
		code, body := testkit.HTTPGet(base + "/api/inventory")
		return code == 200 && strings.Contains(body, `"serial":"5e41a1"`) && strings.Contains(body, `"skipped":[{"key":"pod.evil.64656661756c74"`)
	})
	// Polled, not read once: a scrape is its own request, served from whatever the
	// watch has mirrored by then.
	if !testkit.Poll(testkit.Timeout, func() bool {
		_, metrics = testkit.HTTPGet(base + "/metrics")
		return strings.Contains(metrics, "meshagent_fleet_inventory_records_skipped 1") &&
			strings.Contains(metrics, `meshagent_fleet_certificates{expires_in="1h"} 1`)
	}) {
		t.Fatalf("metrics with a skipped record:\n%s", metrics)
	}
	// DNS rebinding: the same socket, asked for by an attacker's name, gives nothing.
	for _, path := range []string{"/api/inventory", "/api/events", "/metrics", "/", "/app.js"} {
		for _, host := range []string{"evil.example", "evil.example:" + portOf(hs.Addr()), "127.0.0.1.evil.example", "localhost.evil.example"} {
			code, body := getWithHost(t, base+path, host)
			if code != http.StatusMisdirectedRequest || strings.Contains(body, "5e41a1") || strings.Contains(body, "web-0") ||
				strings.Contains(body, "meshagent_fleet") || strings.Contains(body, "<script") {
				t.Errorf("Host %s %s: %d %q", host, path, code, body)
			}
		}
	}
	for _, host := range []string{"localhost:" + portOf(hs.Addr()), "LOCALHOST.", hs.Addr().String()} {
		if code, body := getWithHost(t, base+"/api/inventory", host); code != 200 || !strings.Contains(body, "5e41a1") {
			t.Errorf("Host %s: %d %q", host, code, body)
		}
	}
	if code, body := testkit.HTTPGet(base + "/"); code != 200 || !strings.Contains(body, `<script src="app.js">`) {
		t.Fatalf("page: %d %q", code, body)
	}

	// The feed: the event comes first, as the backlog of a new page.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var kind string
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "event: ") {
			kind = strings.TrimPrefix(line, "event: ")
		}
		if kind == "ev" && strings.HasPrefix(line, "data: ") && strings.Contains(line, `"type":"cert.issued"`) && strings.Contains(line, "5e41a1") {
			break
		}
	}
	if sc.Err() != nil {
		t.Fatal(sc.Err())
	}
	testkit.Eventually(t, "the audit file has the event", func() bool {
		data, _ := os.ReadFile(file)
		return strings.Contains(string(data), `"serial":"5e41a1"`)
	})
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("the inventory role was refused: %v", e)
	}
}
