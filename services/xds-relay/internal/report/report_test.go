package report

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPublishesInOrderAndFlushesOnShutdown(t *testing.T) {
	ns := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, ns))
	ctx := context.Background()
	st, err := bus.EnsureEventStream(ctx, js, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := New(js, "xds-relay/web-0", prometheus.NewRegistry(), hclog.NewNullLogger())
	// Queued before Run starts and flushed when it stops.
	p.Publish("meshagent.evt.pod.web-0.xds.connected", events.XDSConnected{Pod: "web-0", Stream: "1", Mode: "sotw", Upstream: "cp:1"})
	p.Publish("meshagent.evt.pod.web-0.xds.disconnected", events.XDSDisconnected{Pod: "web-0", Stream: "1", Reason: "downstream closed"})
	p.Publish("meshagent.evt.pod.web-0.xds.nack", events.XDSNack{Pod: "not a pod!"}) // invalid: dropped, counted
	rctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Run(rctx); err != nil {
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
	if m.Subject != "meshagent.evt.pod.web-0.xds.connected" || m.Header.Get(events.HeaderSource) != "xds-relay/web-0" {
		t.Fatalf("first event %s from %s", m.Subject, m.Header.Get(events.HeaderSource))
	}
	if v := testutil.ToFloat64(p.dropped); v != 1 {
		t.Fatalf("dropped = %v, want 1", v)
	}
}

func TestFullBacklogDropsInsteadOfBlocking(t *testing.T) {
	ns := bustest.Server(t)
	js, _ := jetstream.New(bustest.Conn(t, ns))
	p := New(js, "xds-relay/web-0", nil, hclog.NewNullLogger())
	done := make(chan struct{})
	go func() {
		for range Backlog + 10 {
			p.Publish("meshagent.evt.pod.web-0.xds.disconnected", events.XDSDisconnected{Pod: "web-0", Stream: "1", Reason: "x"})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a full backlog")
	}
	if v := testutil.ToFloat64(p.dropped); v != 10 {
		t.Fatalf("dropped = %v, want 10", v)
	}
}
