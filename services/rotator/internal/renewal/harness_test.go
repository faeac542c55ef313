package renewal

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// harness is one embedded NATS server, a fake clock shared by every replica, a
// publisher standing in for the signer and sds-edge, and a recorder of every
// renew-due sent to any pod.
type harness struct {
	t   *testing.T
	srv *server.Server
	clk *clock.Fake
	nc  *nats.Conn
	js  jetstream.JetStream

	renewals *bustest.Recorder // renew-due as the rotator sent them

	ca         *testCA
	realBundle *nats.Subscription // the real CA's bundle responder
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, srv: bustest.Server(t), clk: clock.NewFake(time.Now().UTC().Truncate(time.Second))}
	h.nc = bustest.Conn(t, h.srv)
	h.js = bustest.JetStream(t, h.nc)
	// The signer creates the event stream; the rotator only waits for it.
	if _, err := bus.EnsureEventStream(context.Background(), h.js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	h.ca = newTestCA(t)
	h.ca.root("root-a")
	h.realBundle = h.ca.serveBundle(t, h.nc)
	h.renewals = bustest.Record(t, h.nc, events.PodRenewWildcard)
	return h
}

// newLeader is a harness with one replica, r0, leading and caught up.
func newLeader(t *testing.T) (*harness, *replica) {
	t.Helper()
	h := newHarness(t)
	r := h.start(testOptions("r0"))
	waitLeader(t, r)
	return h, r
}

func testOptions(instance string) Options {
	return Options{
		Schedule: schedule.Config{GraceRatio: 0.5, Jitter: 0, RetryAfter: time.Hour, RetryMax: 4 * time.Hour, Rate: 1000, Burst: 100},
		Instance: instance, LeaseTTL: 5 * time.Second, Consumer: "rotator",
		Bucket: "rotator_test", LeaseBucket: "rotator_test_lease", Replicas: 1,
	}
}

type replica struct {
	*Replica
	nc   *nats.Conn
	reg  *prometheus.Registry
	stop func() // shuts the replica down cleanly (it releases its lease); once
}

func (h *harness) start(opts Options) *replica {
	h.t.Helper()
	nc := bustest.Conn(h.t, h.srv)
	reg := prometheus.NewRegistry()
	log := hclog.New(&hclog.LoggerOptions{Name: opts.Instance, Level: hclog.Warn, Output: testWriter{h.t}})
	r, err := New(opts, lifecycle.Deps{Bus: nc, Clock: h.clk, Log: log, Metrics: reg})
	if err != nil {
		h.t.Fatal(err)
	}
	return &replica{Replica: r, nc: nc, reg: reg, stop: testkit.Background(h.t, r.Run)}
}

// crash cuts the replica off the bus first, so it cannot clean up.
func (r *replica) crash() {
	r.nc.Close()
	r.stop()
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func (h *harness) publish(subject string, p events.Payload) {
	h.t.Helper()
	h.publishAt(subject, p, time.Time{})
}

// publishAt publishes p as an event of time at (zero: now, by the wall clock, as
// events.NewMsg stamps it).
func (h *harness) publishAt(subject string, p events.Payload, at time.Time) {
	h.t.Helper()
	m, err := events.NewMsg(subject, "test", p)
	if err != nil {
		h.t.Fatal(err)
	}
	if !at.IsZero() {
		m.Header.Set(events.HeaderTime, at.UTC().Format(time.RFC3339Nano))
	}
	if err := bus.Publish(context.Background(), h.js, m); err != nil {
		h.t.Fatal(err)
	}
}

// issue publishes a genuine cert.issued: a leaf with serial (hex) under the test
// CA's root named root, its chain and the record that matches it, issued at nb
// (the event's time, from which the schedule counts).
func (h *harness) issue(pod, serial string, nb time.Time, life time.Duration, root string) events.CertIssued {
	h.t.Helper()
	ev := h.ca.record(h.t, pod, serial, nb, life, root)
	h.publishAt(events.SubjectCertIssued, ev, nb)
	return ev
}

// sent is every renew-due sent so far; one that does not decode fails the test.
func (h *harness) sent() []events.RenewDue {
	var out []events.RenewDue
	for _, m := range h.renewals.Msgs() {
		rd, _, err := events.Decode[events.RenewDue](m)
		if err != nil {
			h.t.Errorf("renew-due does not decode: %v", err)
			continue
		}
		out = append(out, rd)
	}
	return out
}

// perPod counts renew-due by pod and attempt.
func (h *harness) perPod() map[string]int {
	out := map[string]int{}
	for _, r := range h.sent() {
		out[fmt.Sprintf("%s#%d", r.Pod.Name, r.Attempt)]++
	}
	return out
}

func (h *harness) waitSent(n int) []events.RenewDue {
	h.t.Helper()
	testkit.Eventually(h.t, fmt.Sprintf("%d renew-due", n), func() bool { return len(h.sent()) >= n })
	return h.sent()
}

// settle flushes the server round trip so that anything already sent has arrived.
func (h *harness) settle(reps ...*replica) {
	h.t.Helper()
	for _, r := range reps {
		if !r.nc.IsClosed() {
			_ = r.nc.Flush()
		}
	}
	_ = h.nc.Flush()
}

func waitLeader(t *testing.T, r *replica) {
	t.Helper()
	testkit.Eventually(t, r.opts.Instance+" leading and caught up", func() bool { return r.Leader() && r.Ready() == nil })
}

func waitScheduled(t *testing.T, r *replica, n int) {
	t.Helper()
	testkit.Eventually(t, fmt.Sprintf("%d scheduled", n), func() bool {
		st, ok := r.Stats()
		return ok && st.Scheduled == n && r.caughtUp.Load()
	})
}

func counter(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

func sortedPods(rs []events.RenewDue) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Pod.Name)
	}
	sort.Strings(out)
	return out
}

// dpod is test pod name in namespace default, where the tests' identities are.
// The zero PodRef for "" (a certificate of no pod).
func dpod(name string) events.PodRef {
	if name == "" {
		return events.PodRef{}
	}
	return events.PodRef{Namespace: "default", Name: name}
}
