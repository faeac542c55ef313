package rotator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/rotator/rotator"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// New builds without touching the bus; Run sets up the buckets, leads (alone),
// and returns nil when cancelled.
func TestNewBuildsOnlyAndRunLeadsUntilCancelled(t *testing.T) {
	srv := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, srv))
	if _, err := bus.EnsureEventStream(context.Background(), js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg, err := rotator.Load([]string{"-instance", "r0", "-bucket", "sched_test", "-lease-bucket", "lease_test"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	r, err := rotator.New(cfg, lifecycle.Deps{Bus: bustest.Conn(t, srv), Clock: clock.NewFake(time.Now())}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"sched_test", "lease_test"} {
		if _, err := js.KeyValue(context.Background(), b); !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Fatalf("bucket %s after New: %v, want none yet", b, err)
		}
	}
	if r.Ready() == nil {
		t.Fatal("ready before Run")
	}
	stop := testkit.Background(t, r.Run)
	testkit.Eventually(t, "the replica leading and ready", func() bool { return r.Leader() && r.Ready() == nil })
	stop()
}

func TestNewWithoutBusIsAnError(t *testing.T) {
	cfg, err := rotator.Load([]string{"-instance", "r0"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rotator.New(cfg, lifecycle.Deps{}.WithDefaults()); err == nil {
		t.Fatal("built a rotator with no bus")
	}
}
