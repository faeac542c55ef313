package embedded_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLeafTierCarriesPodEventsToTheHubStream: a pod on a node publishes its
// events into the hub's pod-event stream (a JetStream publish, acknowledged
// back through the node), as directly connected pods do.
func TestLeafTierCarriesPodEventsToTheHubStream(t *testing.T) {
	tier := startTier(t, "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sjs, err := jetstream.New(tier.signer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sjs.CreateStream(ctx, jetstream.StreamConfig{Name: events.StreamPodEvents, Subjects: []string{events.PodEventsWildcard}}); err != nil {
		t.Fatal(err)
	}
	pod := events.PodRef{Namespace: "shop", Name: "web-0"}
	js, err := jetstream.New(podConn(t, tier.leaves["node-a"], pod))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{events.PodEventUp, events.PodEventEnvoyReady} {
		subj, err := events.PodEventSubject(pod, kind)
		if err != nil {
			t.Fatal(err)
		}
		// The stream's interest reaches the leaf soon after the stream is made.
		testkit.Eventually(t, subj+" stored through node-a", func() bool {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := js.Publish(pctx, subj, []byte("{}"))
			return err == nil
		})
	}
}
