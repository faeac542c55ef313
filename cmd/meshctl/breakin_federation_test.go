package main

// Break-in: a followed foreign trust domain's endpoint is hostile — it answers
// an endless bundle, or redirects the signer to an internal http URL at every
// refresh. The real signer binary of a `meshctl up` stack must refuse both,
// announce nothing for them, never contact the redirect's target, keep its
// memory, and show both domains with their errors in `meshctl trust` and in its
// metrics.

import (
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func TestBreakInFederationHostileEndpoints(t *testing.T) {
	var served atomic.Int64
	endless := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := []byte(strings.Repeat("{", 64<<10))
		for r.Context().Err() == nil {
			n, err := w.Write(buf)
			served.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(endless.Close)
	var internalHits atomic.Int64
	internal := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { internalHits.Add(1) }))
	t.Cleanup(internal.Close)
	redirect := httptest.NewTLSServer(http.RedirectHandler(internal.URL+"/computeMetadata/v1/", http.StatusFound))
	t.Cleanup(redirect.Close)
	// A good domain beside them: what the checks below see when a bundle is announced.
	southRoot := testkit.NewCA(t, "south root", nil, time.Now(), time.Hour)
	southBundle := spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("south.example"), []*x509.Certificate{southRoot.Cert})
	southBundle.SetRefreshHint(time.Minute)
	southDoc, err := southBundle.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	south := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(southDoc) }))
	t.Cleanup(south.Close)
	caFile := filepath.Join(t.TempDir(), "endpoints.pem")
	if err := os.WriteFile(caFile, pki.EncodeCertPEM(endless.Certificate()), 0o600); err != nil { // httptest's one certificate
		t.Fatal(err)
	}

	dir := testkit.ShortDir(t)
	r := startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour,
		Federate: "west.example|" + endless.URL + "||north.example|" + redirect.URL + "||south.example|" + south.URL, FederateCA: caFile})
	rss := func() float64 {
		t.Helper()
		code, body := testkit.HTTPGet("http://" + r.Stack.Signer.HTTP + "/metrics")
		if code != 200 {
			t.Fatalf("signer /metrics: %d", code)
		}
		m := regexp.MustCompile(`(?m)^process_resident_memory_bytes (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			t.Fatal("signer metrics lack process_resident_memory_bytes")
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	rssBefore := rss()

	type row struct {
		TrustDomain string            `json:"trust_domain"`
		Kind        string            `json:"kind"`
		State       string            `json:"state"`
		Roots       int               `json:"roots"`
		FetchedAt   time.Time         `json:"fetched_at"`
		ErrorReason string            `json:"error_reason"`
		Error       string            `json:"error"`
		Errors      map[string]uint64 `json:"errors"`
	}
	var rows map[string]row
	var last string
	// The stack retries a failed domain every 5 s: two refusals each.
	testkit.EventuallyWithin(t, 45*time.Second, "meshctl trust lists both hostile domains, refused twice", func() bool {
		out, err := meshctl(t, "trust", "-dir", dir, "-o", "json")
		last = out
		var list []row
		if err != nil || json.Unmarshal([]byte(out), &list) != nil {
			return false
		}
		rows = map[string]row{}
		for _, r := range list {
			rows[r.TrustDomain] = r
		}
		return rows["west.example"].Errors["too_large"] >= 2 && rows["north.example"].Errors["redirect"] >= 2 && rows["south.example"].State == "ok"
	})
	if s := rows["south.example"]; s.Roots != 1 || s.FetchedAt.IsZero() {
		t.Errorf("south.example: %+v", s)
	}
	for td, reason := range map[string]string{"west.example": "too_large", "north.example": "redirect"} {
		r := rows[td]
		// Nothing announced: no roots, no success, on the stream or in the signer.
		if r.Kind != "federated" || r.State != "never" || r.Roots != 0 || !r.FetchedAt.IsZero() || r.ErrorReason != reason {
			t.Errorf("%s: %+v\n%s", td, r, last)
		}
	}
	if !strings.Contains(rows["north.example"].Error, internal.URL) || !strings.Contains(rows["west.example"].Error, "-spiffe-bundle-max-size") {
		t.Errorf("errors do not say what happened: %+v", rows)
	}
	if h := internalHits.Load(); h != 0 {
		t.Fatalf("the redirect target was contacted %d times", h)
	}
	// What the fleet was told (the stream's trust.federated subjects): south only.
	js, err := jetstream.New(r.Conn())
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctxT(t, 5*time.Second), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctxT(t, 5*time.Second), jetstream.WithSubjectFilter(events.TrustFederatedWildcard))
	if err != nil {
		t.Fatal(err)
	}
	announced := func(td string) uint64 { subj, _ := events.TrustFederatedSubject(td); return info.State.Subjects[subj] }
	if announced("south.example") == 0 || announced("west.example") != 0 || announced("north.example") != 0 {
		t.Fatalf("announced per subject: %v", info.State.Subjects)
	}
	human, err := meshctl(t, "trust", "-dir", dir)
	if err != nil || !strings.Contains(human, "west.example never fetched") || !strings.Contains(human, "north.example never fetched") {
		t.Fatalf("meshctl trust: %v\n%s", err, human)
	}

	code, body := testkit.HTTPGet("http://" + r.Stack.Signer.HTTP + "/metrics")
	for _, want := range []string{
		`meshagent_signer_federation_up{trust_domain="west.example"} 0`,
		`meshagent_signer_federation_refresh_errors_total{reason="too_large",trust_domain="west.example"}`,
		`meshagent_signer_federation_refresh_errors_total{reason="redirect",trust_domain="north.example"}`,
		`meshagent_signer_federation_last_error_timestamp_seconds{trust_domain="north.example"}`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("signer metrics lack %s", want)
		}
	}
	rssAfter := rss()
	t.Logf("endless endpoint wrote %d bytes into the signer's connections; signer RSS %.1f -> %.1f MiB",
		served.Load(), rssBefore/(1<<20), rssAfter/(1<<20))
	// Loose (the signer does other work meanwhile): reading the body would be hundreds of MiB.
	if rssAfter-rssBefore > 64<<20 {
		t.Fatalf("signer RSS grew by %.0f MiB while refusing an endless bundle", (rssAfter-rssBefore)/(1<<20))
	}
}
