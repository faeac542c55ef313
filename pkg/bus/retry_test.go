package bus

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// coldServer is a server whose JetStream is not up yet, as a cluster member is until
// its meta leader is elected; start brings it up.
func coldServer(t *testing.T) (s *server.Server, start func()) {
	t.Helper()
	s, err := embedded.Start(embedded.Config{Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	dir := t.TempDir()
	return s, func() {
		if err := s.EnableJetStream(&server.JetStreamConfig{StoreDir: dir}); err != nil {
			t.Error(err)
		}
	}
}

// TestRetryWaitsForJetStream: the first request goes unanswered (a cluster electing
// its leader), the next finds no JetStream yet; Retry keeps trying with short
// attempts and creates the stream once JetStream is up.
func TestRetryWaitsForJetStream(t *testing.T) {
	attemptTimeout = 300 * time.Millisecond
	t.Cleanup(func() { attemptTimeout = AttemptTimeout })
	s, start := coldServer(t)
	nc := bustest.Conn(t, s)
	js := bustest.JetStream(t, nc)

	// A silent responder on the API: requests reach it and are never answered.
	swallowed := make(chan struct{}, 16)
	mute := bustest.Conn(t, s)
	sub, err := mute.Subscribe("$JS.API.>", func(*nats.Msg) { swallowed <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	if err := mute.Flush(); err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int32
	var errs []error
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		done <- Retry(ctx, clock.Real{}, hclog.NewNullLogger(), "event stream", func(ctx context.Context) error {
			attempts.Add(1)
			_, err := EnsureEventStream(ctx, js, 1, time.Hour)
			if err != nil {
				errs = append(errs, err)
			}
			return err
		})
	}()
	<-swallowed
	_ = sub.Unsubscribe() // now: no responder at all (JetStream not up)
	_ = mute.Flush()
	testkit.Eventually(t, "three attempts", func() bool { return attempts.Load() >= 3 })
	start()
	if err := <-done; err != nil {
		t.Fatalf("retry: %v", err)
	}
	if len(errs) < 2 || !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Fatalf("want a timed-out attempt first and more failures, got %v", errs)
	}
	if _, err := js.Stream(context.Background(), events.StreamEvents); err != nil {
		t.Fatalf("stream not created: %v", err)
	}
}

func TestRetryGivesUpAtDeadlineNamingWhat(t *testing.T) {
	s, _ := coldServer(t)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var n int
	err := Retry(ctx, clock.Real{}, hclog.NewNullLogger(), "event stream MESHAGENT_EVENTS", func(ctx context.Context) error {
		n++
		_, err := js.Stream(ctx, events.StreamEvents)
		return err
	})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "event stream MESHAGENT_EVENTS") ||
		!strings.Contains(err.Error(), "no responders") || n < 2 {
		t.Fatalf("err = %v after %d attempts", err, n)
	}
}

func TestRetryStopsOnPermanentError(t *testing.T) {
	s := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	// A stream of that name over other subjects: no retry will fix it.
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: events.StreamEvents, Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	n := 0
	err := Retry(context.Background(), clock.Real{}, hclog.NewNullLogger(), "event stream", func(ctx context.Context) error {
		n++
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: events.StreamEvents, Subjects: []string{"more.>"}})
		return err
	})
	if err == nil || n != 1 || Transient(err) {
		t.Fatalf("err = %v after %d attempts", err, n)
	}
}

func TestRetryRetriesPending(t *testing.T) {
	n := 0
	err := Retry(context.Background(), clock.Real{}, hclog.NewNullLogger(), "stream", func(ctx context.Context) error {
		if n++; n < 3 {
			return Pending(jetstream.ErrStreamNotFound)
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("err = %v after %d attempts", err, n)
	}
	if Transient(jetstream.ErrStreamNotFound) || !Transient(Pending(jetstream.ErrStreamNotFound)) || Pending(nil) != nil {
		t.Fatal("Pending/Transient")
	}
}

// TestAttemptLimitGrows: the first attempts are short (an election loses them),
// later ones get the whole AttemptTimeout.
func TestAttemptLimitGrows(t *testing.T) {
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 3 * time.Second, 10: 3 * time.Second} {
		if got := attemptLimit(n); got != want {
			t.Errorf("attempt %d: %s, want %s", n, got, want)
		}
	}
}
