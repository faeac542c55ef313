package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestViewKeepsUpWithABurstOfCertificates is issue 29's first finding: after
// `bench sign` the page stayed at 1,447 of 5,004 certificates, because the
// inventory role could not answer its watch's flow control. Thousands of
// certificates issued fast, then one more renewal of the first pod: the API lists
// every one and the renewed serial, and the server refused the inventory role
// nothing.
func TestViewKeepsUpWithABurstOfCertificates(t *testing.T) {
	const n = 2500
	m := bustest.SecureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	if _, err := bus.EnsureEventStream(ctx, bustest.JetStream(t, signer), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	var errs bustest.Errors
	hs := obs.NewServer("127.0.0.1:0", hclog.NewNullLogger())
	s, err := New(Config{Metrics: hs.Registry(), Listen: "127.0.0.1:0"}, m.Conn(t, policy.Inventory, &errs), clock.Real{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	hs.Handle("/", s.Handler())
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- lifecycle.Tasks(sctx, hs.Run, s.Run) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	<-hs.Bound()
	base := "http://" + hs.Addr().String()
	testkit.Eventually(t, "ready", func() bool { code, _ := testkit.HTTPGet(base + "/readyz"); return code == 200 })

	js := bustest.JetStream(t, signer)
	now := time.Now()
	issue := func(i int, serial string) {
		msg, err := events.NewMsg(events.SubjectCertIssued, "signer-0", events.CertIssued{Serial: serial,
			SPIFFEID: "spiffe://td/ns/load/sa/web", NotBefore: now, NotAfter: now.Add(time.Hour),
			Pod: events.PodRef{Namespace: "load", Name: fmt.Sprintf("web-%d", i)}, KeyAlgorithm: "EC-P256",
			AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "r"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		issue(i, fmt.Sprintf("%06x", i+1))
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing the burst timed out")
	}
	// The whole burst is counted; the page holds web-0's record (the API pages:
	// one pod asked for by name).
	count := func() (int, string) {
		code, body := testkit.HTTPGet(base + "/api/inventory?pod=load/web-0&limit=5")
		if code != 200 {
			return -1, ""
		}
		var got struct {
			Counts struct {
				Certificates int `json:"certificates"`
			} `json:"counts"`
			Certs []struct{ Pod, Serial string } `json:"certificates"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			return -1, ""
		}
		first := ""
		for _, c := range got.Certs {
			if c.Pod == "load/web-0" {
				first = c.Serial
			}
		}
		return got.Counts.Certificates, first
	}
	testkit.EventuallyWithin(t, 90*time.Second, "the view lists the whole burst", func() bool { c, _ := count(); return c == n })
	// An update after the load reaches the view too.
	issue(0, "ffff01")
	testkit.EventuallyWithin(t, 30*time.Second, "the view shows web-0's renewal", func() bool { c, s := count(); return c == n && s == "ffff01" })
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("the inventory role was refused under load: %v", e[0])
	}
}

// TestFeedPrintsHistoryAsItWas: an event replayed into a new page's feed an hour
// after it happened says "expires in 30m0s" (its certificate's life at issue), not
// a negative duration from now.
func TestFeedPrintsHistoryAsItWas(t *testing.T) {
	s, err := New(Config{Metrics: prometheus.NewRegistry()}, &nats.Conn{}, clock.Real{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	then := time.Now().Add(-time.Hour)
	s.event(auditlog.Entry{Seq: 7, Meta: events.Meta{Type: events.CertIssued{}.EventType(), Time: then},
		Payload: events.CertIssued{Serial: "5e41a1", SPIFFEID: "spiffe://td/ns/a/sa/web", NotBefore: then, NotAfter: then.Add(30 * time.Minute),
			Pod: events.PodRef{Namespace: "default", Name: "web-0"}}})
	if len(s.recent) != 1 {
		t.Fatalf("feed holds %d items", len(s.recent))
	}
	var item struct {
		Time time.Time `json:"time"`
		Text string    `json:"text"`
	}
	if err := json.Unmarshal(s.recent[0].Data, &item); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(item.Text, "expires in 30m0s") || !item.Time.Equal(then) {
		t.Fatalf("replayed item: %+v", item)
	}
}

// TestBenchLoadStaysOutOfTheView: meshctl bench's certificates (namespace
// meshagent-bench) are left out of the inventory API unless asked for, out of the
// fleet gauges (counted on a gauge of their own) and out of the page's feed.
func TestBenchLoadStaysOutOfTheView(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Config{Metrics: reg}, &nats.Conn{}, clock.Real{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	put := func(key, pod, id string) {
		b, _ := json.Marshal(inventory.Cert{Pod: pod, SPIFFEID: id, Serial: key, NotBefore: now, NotAfter: now.Add(30 * time.Minute)})
		s.view.Put(key, b)
	}
	put("pod.default.1", "default/web-0", "spiffe://td/ns/default/sa/web")
	put("id.1", "", "spiffe://td/ns/meshagent-bench/sa/load-0")
	put("pod.bench.1", "meshagent-bench/load-1", "spiffe://td/ns/meshagent-bench/sa/load-1")
	s.synced = true

	get := func(url string) (got struct {
		Bench int `json:"bench_hidden"`
		Certs []struct {
			Pod string `json:"pod"`
		} `json:"certificates"`
	}) {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, url, nil))
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		return got
	}
	if got := get("/api/inventory"); len(got.Certs) != 1 || got.Certs[0].Pod != "default/web-0" || got.Bench != 2 {
		t.Fatalf("inventory API: %+v", got)
	}
	if got := get("/api/inventory?bench=1"); len(got.Certs) != 3 || got.Bench != 0 {
		t.Fatalf("inventory API with bench=1: %+v", got)
	}
	if n := testutil.CollectAndCount(reg, "meshagent_fleet_certificates"); n == 0 {
		t.Fatal("no fleet gauges")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP meshagent_fleet_bench_certificates Certificates of meshctl bench (namespace meshagent-bench) in the inventory, left out of the other gauges.
# TYPE meshagent_fleet_bench_certificates gauge
meshagent_fleet_bench_certificates 2
# HELP meshagent_fleet_pods Pods holding a certificate in the inventory, by state (up, down).
# TYPE meshagent_fleet_pods gauge
meshagent_fleet_pods{state="down"} 0
meshagent_fleet_pods{state="up"} 1
`), "meshagent_fleet_bench_certificates", "meshagent_fleet_pods"); err != nil {
		t.Fatal(err)
	}
	s.event(auditlog.Entry{Meta: events.Meta{Type: events.TypeCertIssued, Time: now}, Payload: events.CertIssued{Serial: "b1",
		SPIFFEID: "spiffe://td/ns/meshagent-bench/sa/load-0", NotBefore: now, NotAfter: now.Add(time.Hour)}})
	if len(s.recent) != 0 {
		t.Fatalf("bench event in the feed: %s", s.recent[0].Data)
	}
}
