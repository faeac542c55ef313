package faults

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRotatorWaitsForPlacement: a rotator whose replicated buckets cannot be placed
// yet — here the third node of a three-node cluster has never been seen, as after a
// meta-leader change, when the new leader has not heard from every peer — gets "no
// suitable peers for placement". It must wait, not exit, and come up once the node
// is there. (TestClusterNodeLoss met this by chance: a slow rotator opened its
// buckets just as the stream leader was killed, and exited.)
func TestRotatorWaitsForPlacement(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster and the rotator binary")
	}
	c := newCluster(t)
	c.startAll(c.names[0], c.names[1])
	testkit.EventuallyWithin(t, time.Minute, "a JetStream meta leader on two nodes", func() bool { return c.metaLeader() != "" })
	nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The event streams the rotator waits for, on one replica: they can be placed now.
	testkit.EventuallyWithin(t, time.Minute, "the event streams created", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: events.StreamEvents,
			Subjects: events.CAEventSubjects, Replicas: 1, Storage: jetstream.FileStorage})
		if err == nil {
			_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: events.StreamPodEvents,
				Subjects: []string{events.PodEventsWildcard}, Replicas: 1, Storage: jetstream.FileStorage})
		}
		return err == nil
	})

	rot := run(t, "rotator", "rotator", "NATS_URL="+c.urls(), "TRUST_DOMAIN=cluster.local",
		"ROTATOR_INSTANCE=rotator-1", "ROTATOR_JS_REPLICAS=3", "HTTP_ADDR="+testkit.FreeAddr(t))
	waitLog := func(what, line string) {
		t.Helper()
		testkit.EventuallyWithin(t, time.Minute, what, func() bool {
			if rot.exited() {
				t.Fatalf("rotator exited: %s", rot.output())
			}
			return strings.Contains(rot.output(), line)
		})
	}
	waitLog("the rotator waiting for its schedule bucket's placement", `waiting for jetstream: for="schedule bucket`)
	c.start(c.names[2])
	waitLog("the rotator's schedule ready once the third node is there", "schedule ready")
}
