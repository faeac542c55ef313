package dashboard

import (
	"bufio"
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/testkit"
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

func TestExpiryBuckets(t *testing.T) {
	for left, want := range map[time.Duration]string{-time.Second: "expired", 0: "expired", time.Minute: "1h", 2 * time.Hour: "6h",
		23 * time.Hour: "24h", 3 * 24 * time.Hour: "7d", 20 * 24 * time.Hour: "30d", 400 * 24 * time.Hour: "later"} {
		if got := ExpiryBucket(left); got != want {
			t.Errorf("%s: %s, want %s", left, got, want)
		}
	}
}

// TestServeKeepsAndShowsTheFleet: meshctl serve on the secured bus, as the inventory
// role, folds a certificate into the inventory, serves it as JSON, counts it in the
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
	s, err := New(Config{Addr: "127.0.0.1:0", Sink: sink}, m.Conn(t, policy.Inventory, &errs), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case <-s.Bound():
	case err := <-done:
		t.Fatal(err)
	}
	base := "http://" + s.Addr().String()
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
	testkit.Eventually(t, "the metrics count it", func() bool {
		_, body := testkit.HTTPGet(base + "/metrics")
		return strings.Contains(body, `meshagent_fleet_certificates{expires_in="1h"} 1`) &&
			strings.Contains(body, `meshagent_fleet_certs_issued_total{signer="signer-0"} 1`)
	})
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
