package outbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestMain fails the package if a test leaves goroutines behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const metric = "meshagent_test_events_dropped_total"

func TestPublishesInOrderAndFlushesOnShutdown(t *testing.T) {
	ns := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, ns))
	ctx := context.Background()
	if _, err := bus.EnsureEventStream(ctx, js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The outbox sends pod events: the pods' stream keeps them.
	st, err := js.Stream(ctx, events.StreamPodEvents)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	b, err := New(js, Options{Source: "xds-relay/web-0", Metric: metric, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	// Queued before Run starts and flushed when it stops.
	b.Publish("meshagent.evt.pod.default.web-0.xds.connected", events.XDSConnected{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Stream: "1", Mode: "sotw", Upstream: "cp:1"})
	b.Publish("meshagent.evt.pod.default.web-0.xds.disconnected", events.XDSDisconnected{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Stream: "1", Reason: "downstream closed"})
	b.Publish("meshagent.evt.pod.default.web-0.xds.nack", events.XDSNack{Pod: events.PodRef{Namespace: "default", Name: "not a pod!"}}) // invalid: dropped, counted
	rctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Run(rctx); err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream holds %d events, want 2", info.State.Msgs)
	}
	m, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "meshagent.evt.pod.default.web-0.xds.connected" || m.Header.Get(events.HeaderSource) != "xds-relay/web-0" {
		t.Fatalf("first event %s from %s", m.Subject, m.Header.Get(events.HeaderSource))
	}
	// The counter is registered under the caller's name.
	if n, err := testutil.GatherAndCount(reg, metric); err != nil || n != 1 {
		t.Fatalf("%s registered %d times (%v)", metric, n, err)
	}
	if v := testutil.ToFloat64(b.dropped); v != 1 {
		t.Fatalf("dropped = %v, want 1", v)
	}
}

func TestFullQueueDropsInsteadOfBlocking(t *testing.T) {
	ns := bustest.Server(t)
	js, _ := jetstream.New(bustest.Conn(t, ns))
	b, err := New(js, Options{Source: "xds-relay/web-0", Size: 16, Metric: metric})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for range 16 + 10 {
			b.Publish("meshagent.evt.pod.default.web-0.xds.disconnected", events.XDSDisconnected{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Stream: "1", Reason: "x"})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a full queue")
	}
	if v := testutil.ToFloat64(b.dropped); v != 10 {
		t.Fatalf("dropped = %v, want 10", v)
	}
}

// TestFlushIsBounded: with no stream to take the events, Run still returns about
// Flush after its context ends, and counts every event it could not publish.
func TestFlushIsBounded(t *testing.T) {
	ns := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, ns)) // no event stream: publishes are retried
	b, err := New(js, Options{Source: "sds-edge/web-0", Flush: 200 * time.Millisecond, Metric: metric})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		b.Publish("meshagent.evt.pod.default.web-0.down", events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Reason: "shutdown"})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := b.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Run took %s to stop with a 200ms flush", took)
	}
	if v := testutil.ToFloat64(b.dropped); v != 3 {
		t.Fatalf("dropped = %v, want 3", v)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	js, _ := jetstream.New(bustest.Conn(t, bustest.Server(t)))
	reg := prometheus.NewRegistry()
	if _, err := New(js, Options{Source: "a/b", Metric: metric, Registry: reg}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		js   jetstream.JetStream
		o    Options
		want string
	}{
		{"no js", nil, Options{Source: "a/b", Metric: "m"}, "no JetStream"},
		{"no source", js, Options{Metric: "m"}, "Source is required"},
		{"no metric", js, Options{Source: "a/b"}, "Metric is required"},
		{"negative size", js, Options{Source: "a/b", Metric: "m", Size: -1}, "must not be negative"},
		{"metric taken", js, Options{Source: "a/b", Metric: metric, Registry: reg}, "register " + metric},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.js, tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestHoldsEventsUntilTheStreamIsBack: events published while there is no event
// stream are held and delivered, in order and each once, when it appears; none is
// counted as dropped.
func TestHoldsEventsUntilTheStreamIsBack(t *testing.T) {
	ns := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, ns)) // no event stream yet
	held := make(chan struct{})
	var once sync.Once
	log := hclog.New(&hclog.LoggerOptions{Output: writerFunc(func(p []byte) {
		if strings.Contains(string(p), "holding events") {
			once.Do(func() { close(held) })
		}
	})})
	b, err := New(js, Options{Source: "sds-edge/web-0", Metric: metric, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done }()
	b.Publish("meshagent.evt.pod.default.web-0.up", events.PodUp{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Mode: "ca"})
	b.Publish("meshagent.evt.pod.default.web-0.sds.pushed", events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Resource: "default", Version: "1", Kind: "pushed"})
	// A whole round of attempts fails, and the events are held, not dropped.
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the outbox never said it holds the events")
	}
	if v := testutil.ToFloat64(b.dropped); v != 0 {
		t.Fatalf("dropped %v events while the stream was missing", v)
	}
	if _, err := bus.EnsureEventStream(context.Background(), js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), events.StreamPodEvents)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the stream holding the 2 held events", func() bool {
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs == 2
	})
	m, err := st.GetMsg(context.Background(), 1)
	if err != nil || m.Subject != "meshagent.evt.pod.default.web-0.up" {
		t.Fatalf("first event %v (%v), want pod.up", m, err)
	}
	if v := testutil.ToFloat64(b.dropped); v != 0 {
		t.Fatalf("dropped = %v, want 0", v)
	}
}

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }
