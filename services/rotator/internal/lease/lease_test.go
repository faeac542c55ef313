package lease

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestLeaderStepsDownWhenCutOff: a leader that cannot renew gives up within TTL/2,
// before any follower may take over, so two never lead at once.
func TestLeaderStepsDownWhenCutOff(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	kv, err := OpenBucket(context.Background(), bustest.JetStream(t, nc), "lease_test", 1)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	l := New(kv, clk, "a", 5*time.Second, hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	leading := make(chan struct{}, 1)
	lost := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- l.Run(ctx, func(tctx context.Context) {
			leading <- struct{}{}
			<-tctx.Done()
			lost <- struct{}{}
		})
	}()
	defer func() { cancel(); <-done }()
	<-leading
	if !l.Leader() || l.Holder() != "a" {
		t.Fatal("not leading")
	}
	nc.Close() // cut off the bus
	var elapsed time.Duration
	for l.Leader() {
		n := l.Rounds()
		clk.Add(l.Period())
		elapsed += l.Period()
		testkit.Eventually(t, "a round", func() bool { return l.Rounds() > n })
		if elapsed > l.ttl {
			t.Fatalf("still leading %v after losing the bus", elapsed)
		}
	}
	<-lost
	if elapsed > l.ttl/2+l.Period() {
		t.Fatalf("stepped down after %v, want within TTL/2 (%v)", elapsed, l.ttl/2)
	}
}
