package bus

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// outcome collects what done was called with, and how often.
type outcome struct {
	calls atomic.Int32
	err   atomic.Value
}

func (o *outcome) done(err error) {
	o.calls.Add(1)
	if err != nil {
		o.err.Store(err)
	}
}

func (o *outcome) wait(t *testing.T, what string) error {
	t.Helper()
	testkit.EventuallyWithin(t, 15*time.Second, what, func() bool { return o.calls.Load() > 0 })
	err, _ := o.err.Load().(error)
	return err
}

func podDown(t *testing.T, pod string) *nats.Msg {
	t.Helper()
	msg, err := events.NewMsg("meshagent.evt.pod.default."+pod+".down", "test", events.PodDown{Pod: ref(pod)})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func startedPublisher(t *testing.T, nc *nats.Conn) *AsyncPublisher {
	t.Helper()
	p := NewAsyncPublisher(nc, clock.Real{})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// TestAsyncPublishStoresOnceAndCallsBackOnce: an event is stored and done is
// called once with nil; the same event again (a retry) is stored once.
func TestAsyncPublishStoresOnceAndCallsBackOnce(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := EnsureEventStream(ctx, bustest.JetStream(t, nc), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Pod events: kept in the pods' stream.
	st, err := bustest.JetStream(t, nc).Stream(ctx, events.StreamPodEvents)
	if err != nil {
		t.Fatal(err)
	}
	p := startedPublisher(t, nc)
	first := podDown(t, "p1")
	again := nats.NewMsg(first.Subject)
	again.Header, again.Data = nats.Header(http.Header(first.Header).Clone()), first.Data
	for _, m := range []*nats.Msg{first, again} {
		var o outcome
		p.Publish(m, time.Now().Add(5*time.Second), o.done)
		if err := o.wait(t, "stored"); err != nil {
			t.Fatal(err)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 || p.Pending() != 0 {
		t.Fatalf("stream holds %d messages, %d pending; want 1, 0", info.State.Msgs, p.Pending())
	}
}

// TestAsyncPublishWaitsForAStream: with no stream (a cluster without a leader
// answers the same: no responders) the event is sent again until one exists;
// past its deadline it is done with an error saying so.
func TestAsyncPublishWaitsForAStream(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	p := startedPublisher(t, nc)
	var late outcome
	p.Publish(podDown(t, "p1"), time.Now().Add(300*time.Millisecond), late.done)
	if err := late.wait(t, "given up"); err == nil || !strings.Contains(err.Error(), "deadline") || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("got %v, want no responders by the deadline", err)
	}
	var o outcome
	sent := nc.Stats().OutMsgs
	p.Publish(podDown(t, "p2"), time.Now().Add(10*time.Second), o.done)
	testkit.Eventually(t, "three attempts without a stream", func() bool { return nc.Stats().OutMsgs >= sent+3 })
	if o.calls.Load() != 0 {
		t.Fatalf("done before any stream exists: %v", o.err.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := EnsureEventStream(ctx, bustest.JetStream(t, nc), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := o.wait(t, "stored once the stream exists"); err != nil {
		t.Fatal(err)
	}
	if late.calls.Load() != 1 || o.calls.Load() != 1 {
		t.Fatalf("done called %d and %d times", late.calls.Load(), o.calls.Load())
	}
}

// TestAsyncPublishResendsAnUnansweredAttempt: an attempt whose ack never comes (a
// leader that died) is sent again after PublishAttempt, with the same dedup id.
func TestAsyncPublishResendsAnUnansweredAttempt(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	seen := make(chan string, 4)
	var attempts atomic.Int32
	// A stand-in stream that ignores the first attempt and acks the second.
	if _, err := nc.Subscribe("meshagent.evt.>", func(m *nats.Msg) {
		seen <- m.Header.Get(jetstream.MsgIDHeader)
		if attempts.Add(1) > 1 {
			_ = m.Respond([]byte(`{"stream":"EVENTS","seq":1}`))
		}
	}); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	p := NewAsyncPublisher(nc, clk)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	msg := podDown(t, "p1")
	var o outcome
	start := clk.Now()
	p.Publish(msg, start.Add(10*time.Second), o.done)
	testkit.Eventually(t, "acked on the second attempt", func() bool {
		if o.calls.Load() > 0 {
			return true
		}
		clk.Add(100 * time.Millisecond)
		return false
	})
	if err, _ := o.err.Load().(error); err != nil {
		t.Fatal(err)
	}
	if took := clk.Now().Sub(start); took < PublishAttempt {
		t.Fatalf("acked after %s, before the first attempt timed out", took)
	}
	if a, b := <-seen, <-seen; a != msg.Header.Get(events.HeaderID) || b != a {
		t.Fatalf("attempts carried dedup ids %q and %q, want the event id", a, b)
	}
}

// TestAsyncPublishRefusedAndStopped: a refusal by the stream (an event over its
// size limit) ends the event at once with the stream's reason; Stop ends what
// waits, and anything published after it, with ErrPublisherStopped.
func TestAsyncPublishRefusedAndStopped(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := EnsureEventStream(ctx, bustest.JetStream(t, nc), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := NewAsyncPublisher(nc, clock.Real{})
	var early outcome
	p.Publish(podDown(t, "p0"), time.Now().Add(time.Second), early.done)
	if err := early.wait(t, "refused before Start"); !errors.Is(err, ErrPublisherStopped) {
		t.Fatalf("before Start: %v", err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	big := podDown(t, "p1")
	big.Data = []byte(`{"pod":"p1","pad":"` + strings.Repeat("x", events.MaxEventSize+8192) + `"}`)
	var refused outcome
	p.Publish(big, time.Now().Add(5*time.Second), refused.done)
	if err := refused.wait(t, "refused"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("oversized event: %v", err)
	}
	// An event nothing answers, then Stop.
	var waiting outcome
	lost := nats.NewMsg("meshagent.unstored.x")
	lost.Header.Set(events.HeaderID, "x")
	p.Publish(lost, time.Now().Add(time.Minute), waiting.done)
	p.Stop()
	var after outcome
	p.Publish(podDown(t, "p2"), time.Now().Add(time.Second), after.done)
	for name, o := range map[string]*outcome{"waiting": &waiting, "after": &after} {
		if err := o.wait(t, name); !errors.Is(err, ErrPublisherStopped) || o.calls.Load() != 1 {
			t.Fatalf("%s: %v (%d calls), want ErrPublisherStopped once", name, err, o.calls.Load())
		}
	}
}

func ref(name string) events.PodRef { return events.PodRef{Namespace: "default", Name: name} }
