package renewal

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// The rotator may not create the event stream (the signer does): on a bus without
// it, the rotator waits, creates nothing, and starts once the stream appears.
func TestWaitsForTheEventStream(t *testing.T) {
	srv := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, srv))
	logs := &testkit.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logs})
	r, err := New(testOptions("r0"), lifecycle.Deps{Bus: bustest.Conn(t, srv), Clock: clock.NewFake(time.Now()), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Background(t, r.Run)

	testkit.Eventually(t, "the rotator says it waits", func() bool { return strings.Contains(logs.String(), "waiting for jetstream") })
	if _, err := js.Stream(context.Background(), events.StreamEvents); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the rotator created the stream (or it cannot be looked up): %v", err)
	}
	if r.Ready() == nil {
		t.Fatal("ready without the event stream")
	}

	// The signer comes up and creates it, with its own settings.
	if _, err := bus.EnsureEventStream(context.Background(), js, 1, 90*time.Minute); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the rotator ready once the stream exists", func() bool { return r.Ready() == nil })
	st, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().Config.MaxAge != 90*time.Minute {
		t.Fatalf("stream config changed by the rotator: max age %v", st.CachedInfo().Config.MaxAge)
	}
}

// Past the setup deadline without a stream, the rotator gives up with an error
// that names the stream, and still has created nothing.
func TestGivesUpWithoutTheEventStream(t *testing.T) {
	srv := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, srv))
	r, err := New(testOptions("r0"), lifecycle.Deps{Bus: bustest.Conn(t, srv), Clock: clock.NewFake(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 750*time.Millisecond)
	defer cancel()
	err = r.awaitStream(ctx)
	if err == nil || !strings.Contains(err.Error(), events.StreamEvents) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if _, err := js.Stream(context.Background(), events.StreamEvents); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream after giving up: %v", err)
	}
}
