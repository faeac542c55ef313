package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// startReplica runs one operator replica's dashboard on m as the inventory role
// until stop is called; it returns the base URL.
func startReplica(t *testing.T, m *bustest.Secured, errs *bustest.Errors) (base string, stop func()) {
	t.Helper()
	hs := obs.NewServer("127.0.0.1:0", hclog.NewNullLogger())
	s, err := New(Config{Metrics: hs.Registry(), Listen: "127.0.0.1:0"}, m.Conn(t, policy.Inventory, errs), clock.Real{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	hs.Handle("/", s.Handler())
	hs.AddReadyCheck("inventory", s.Ready)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lifecycle.Tasks(ctx, hs.Run, s.Run) }()
	<-hs.Bound()
	base = "http://" + hs.Addr().String()
	testkit.Eventually(t, "the replica ready", func() bool { code, _ := testkit.HTTPGet(base + "/readyz"); return code == 200 })
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica: %v", err)
		}
	}
	t.Cleanup(stop)
	return base, stop
}

// lastHour is /api/inventory's counts.last_hour.
func lastHour(t *testing.T, base string) (issued, renewals map[string]int, ok bool) {
	code, body := testkit.HTTPGet(base + "/api/inventory")
	if code != 200 {
		return nil, nil, false
	}
	var p struct {
		Counts struct {
			LastHour struct{ Issued, Renewals map[string]int } `json:"last_hour"`
		} `json:"counts"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return p.Counts.LastHour.Issued, p.Counts.LastHour.Renewals, true
}

// TestCountsOutliveTheHistoryAndARestart: the page's last-hour counts come from
// the inventory's counters. A replica counts certificates issued and renewals
// sent; it stops; the event history is cut to its last message; a new replica
// shows the same counts — which it could not have read from the history.
func TestCountsOutliveTheHistoryAndARestart(t *testing.T) {
	m := bustest.SecureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	sjs := bustest.JetStream(t, signer)
	if _, err := bus.EnsureEventStream(ctx, sjs, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	var errs bustest.Errors
	base, stop := startReplica(t, m, &errs)

	now := time.Now()
	for i := range 5 {
		msg, err := events.NewMsg(events.SubjectCertIssued, "signer/signer-0", events.CertIssued{Serial: fmt.Sprintf("5e%04x", i), SPIFFEID: "spiffe://td/ns/a/sa/web",
			NotBefore: now, NotAfter: now.Add(time.Hour), Pod: events.PodRef{Namespace: "a", Name: fmt.Sprintf("web-%d", i)}, KeyAlgorithm: "EC-P256",
			AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "r"})
		if err != nil {
			t.Fatal(err)
		}
		if err := bus.Publish(ctx, sjs, msg); err != nil {
			t.Fatal(err)
		}
	}
	rjs := bustest.JetStream(t, m.Conn(t, policy.Rotator, nil))
	for i := range 3 {
		msg, err := events.NewMsg(events.SubjectRenewSent, "rotator/rotator-0", events.RenewDue{Pod: events.PodRef{Namespace: "a", Name: fmt.Sprintf("web-%d", i)},
			Reason: events.RenewScheduled})
		if err != nil {
			t.Fatal(err)
		}
		if err := bus.Publish(ctx, rjs, msg); err != nil {
			t.Fatal(err)
		}
	}
	want := func() bool {
		issued, renewals, ok := lastHour(t, base)
		return ok && issued["signer-0"] == 5 && len(issued) == 1 && renewals[events.RenewScheduled] == 3 && len(renewals) == 1
	}
	testkit.Eventually(t, "the page counts 5 issued and 3 renewals in the last hour", want)
	stop()

	for _, name := range []string{events.StreamEvents, events.StreamPodEvents} {
		st, err := sjs.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.MaxMsgs = 1
		if _, err := sjs.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("cut %s: %v", name, err)
		}
	}
	base, _ = startReplica(t, m, &errs)
	// The new replica reads its counters once it is up; polled, as they arrive
	// (CI once read the page a moment before). The history is cut: whatever it
	// shows comes from the counters.
	if !testkit.Poll(20*time.Second, want) {
		issued, renewals, _ := lastHour(t, base)
		_, body := testkit.HTTPGet(base + "/api/inventory")
		t.Fatalf("after a restart without the history: issued %v, renewals %v\n%s", issued, renewals, body)
	}
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("the inventory role was refused: %v", e)
	}
}
