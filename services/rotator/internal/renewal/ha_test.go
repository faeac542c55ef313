package renewal

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/rotator/internal/lease"
	"github.com/meshagent/meshagent/tests/testkit"
)

// exactlyOnce checks that every pod in want got exactly one first renew-due and
// nobody else got any.
func exactlyOnce(t *testing.T, h *harness, want []string) {
	t.Helper()
	counts := h.perPod()
	for _, p := range want {
		if n := counts[p+"#1"]; n != 1 {
			t.Errorf("%s got %d renew-due, want 1", p, n)
		}
		delete(counts, p+"#1")
	}
	if len(counts) != 0 {
		t.Errorf("unexpected renew-due: %v", counts)
	}
}

func TestRestartMidSchedule(t *testing.T) {
	h := newHarness(t)
	opts := testOptions("r0")
	opts.Schedule.RetryAfter, opts.Schedule.RetryMax = 24*time.Hour, 48*time.Hour
	a := h.start(opts)
	waitLeader(t, a)
	now := h.clk.Now()
	var pods []string
	for i := range 6 {
		p := fmt.Sprintf("p-%d", i)
		pods = append(pods, p)
		// 10h certificates, due at now + (i+1) hours.
		h.issue(p, fmt.Sprint(i+1), now.Add(time.Duration(i-4)*time.Hour), 10*time.Hour, "root-a")
	}
	waitScheduled(t, a, 6)
	h.clk.Add(2*time.Hour + time.Minute) // p-0 and p-1 due
	h.waitSent(2)
	h.settle(a)
	a.stop()

	// Nobody runs while p-2 and p-3 come due.
	h.clk.Add(2 * time.Hour)
	h.settle()
	if n := len(h.sent()); n != 2 {
		t.Fatalf("%d sent while no rotator ran", n)
	}
	opts.Instance = "r1"
	b := h.start(opts)
	waitLeader(t, b)
	got := h.waitSent(4) // the two overdue ones, promptly: the clock does not move
	if ps := sortedPods(got[2:]); fmt.Sprint(ps) != "[p-2 p-3]" {
		t.Fatalf("sent on start: %v, want p-2 and p-3", ps)
	}
	h.clk.Add(2 * time.Hour) // p-4 and p-5
	h.waitSent(6)
	h.settle(b)
	exactlyOnce(t, h, pods)
}

// TestSplitBrainSendsOnce runs a second leader term beside the real leader, as if
// the lease had failed: the compare-and-set on each entry still lets only one of
// them send each renewal.
func TestSplitBrainSendsOnce(t *testing.T) {
	h := newHarness(t)
	opts := testOptions("r0")
	opts.Schedule.RetryAfter = 24 * time.Hour
	opts.Schedule.Burst = 1000 // the fake clock does not refill the bucket
	a := h.start(opts)
	waitLeader(t, a)
	opts.Instance = "r1"
	// r1's own lease must not take over on the clock jump below: a replica runs
	// one term at a time, and the rogue term is the one this test adds.
	opts.LeaseTTL = 48 * time.Hour
	b := h.start(opts)
	testkit.Eventually(t, "r1 follows", func() bool { return b.Ready() == nil && !b.Leader() })
	now := h.clk.Now()
	var pods []string
	for i := range 200 {
		p := fmt.Sprintf("p-%d", i)
		pods = append(pods, p)
		h.issue(p, fmt.Sprint(i+1), now, 2*time.Hour, "root-a")
	}
	waitScheduled(t, a, 200)
	// The rogue term rebuilds the same schedule from the bucket.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.lead(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitScheduled(t, b, 200)
	h.clk.Add(61 * time.Minute)
	h.waitSent(200)
	h.settle(a, b)
	exactlyOnce(t, h, pods)
	sa := counter(t, a.m.sent.WithLabelValues(events.RenewScheduled))
	sb := counter(t, b.m.sent.WithLabelValues(events.RenewScheduled))
	t.Logf("r0 sent %v, r1 sent %v, conflicts adopted r0 %v r1 %v", sa, sb, counter(t, a.m.conflicts), counter(t, b.m.conflicts))
}

func TestTwoReplicasNoDuplicates(t *testing.T) {
	h := newHarness(t)
	opts := testOptions("r0")
	opts.Schedule.RetryAfter = 24 * time.Hour
	a := h.start(opts)
	waitLeader(t, a)
	opts.Instance = "r1"
	b := h.start(opts)
	testkit.Eventually(t, "r1 knows the lease", func() bool { return b.Ready() == nil })
	if b.Leader() {
		t.Fatal("two leaders")
	}
	now := h.clk.Now()
	var pods []string
	for i := range 40 {
		p := fmt.Sprintf("p-%d", i)
		pods = append(pods, p)
		h.issue(p, fmt.Sprint(i+1), now, time.Duration(120+i)*time.Minute, "root-a")
	}
	waitScheduled(t, a, 40)
	// Move time in steps shorter and longer than the lease TTL: big jumps look like
	// a stalled leader to the follower, so leadership may change hands mid-way.
	// Before the fifth step the lease is rewritten as r1's takeover would write it,
	// so leadership changes hands at least once whatever the race does.
	kv, err := h.js.KeyValue(context.Background(), opts.LeaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i, step := range []time.Duration{time.Second, 30 * time.Minute, 3 * time.Second, 30 * time.Minute, 20 * time.Second, 30 * time.Minute} {
		if i == 4 {
			if _, err := kv.Put(context.Background(), lease.Key, []byte("r1")); err != nil {
				t.Fatal(err)
			}
		}
		ra, rb := a.Lease().Rounds(), b.Lease().Rounds()
		h.clk.Add(step)
		testkit.Eventually(t, fmt.Sprintf("both replicas' lease rounds after step %d", i), func() bool {
			return a.Lease().Rounds() > ra && b.Lease().Rounds() > rb
		})
	}
	if a.Lease().Gained() < 1 || b.Lease().Gained() < 1 {
		t.Fatalf("leadership gained r0 %d, r1 %d times; want both at least once", a.Lease().Gained(), b.Lease().Gained())
	}
	h.waitSent(40)
	h.settle(a, b)
	exactlyOnce(t, h, pods)
	sentA := counter(t, a.m.sent.WithLabelValues(events.RenewScheduled))
	sentB := counter(t, b.m.sent.WithLabelValues(events.RenewScheduled))
	if sentA+sentB != 40 {
		t.Fatalf("replicas sent %v + %v, want 40 in all", sentA, sentB)
	}
	t.Logf("r0 sent %v, r1 sent %v; leadership gained r0 %d, r1 %d times", sentA, sentB, a.Lease().Gained(), b.Lease().Gained())
}

func TestReplicaKilledFailover(t *testing.T) {
	h := newHarness(t)
	a := h.start(testOptions("r0"))
	waitLeader(t, a)
	b := h.start(testOptions("r1"))
	testkit.Eventually(t, "r1 follows", func() bool { return b.Ready() == nil && !b.Leader() })
	now := h.clk.Now()
	h.issue("web-0", "01", now, time.Hour, "root-a")
	for i := range 49 {
		h.issue(fmt.Sprintf("p-%d", i), fmt.Sprint(i+100), now, 10*time.Hour, "root-a")
	}
	waitScheduled(t, a, 50)
	testkit.Eventually(t, "r1's standby schedule warm with all 50", func() bool {
		b.mirrorMu.Lock()
		m := b.mirror
		b.mirrorMu.Unlock()
		if m == nil {
			return false
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.warm && m.sched.Len() == 50
	})

	// Let both replicas run a few rounds, then kill the leader.
	period := a.Lease().Period()
	for range 3 {
		step(t, h, period, a, b)
	}
	a.crash()
	elapsed := time.Duration(0)
	for !b.Leader() {
		if elapsed > 2*b.Lease().MaxFailover() {
			t.Fatalf("no failover after %v", elapsed)
		}
		step(t, h, period, b)
		elapsed += period
	}
	max := b.Lease().MaxFailover()
	t.Logf("failover took %v of fake time (bound %v, ttl %v, period %v)", elapsed, max, b.opts.LeaseTTL, period)
	if elapsed > max {
		t.Fatalf("failover took %v, documented bound %v", elapsed, max)
	}
	if elapsed < b.opts.LeaseTTL-period {
		t.Fatalf("follower took over after %v, before the lease could have expired", elapsed)
	}
	waitLeader(t, b)
	if st, _ := b.Stats(); st.Scheduled != 50 || counter(t, b.m.rebuildChanges) != 0 {
		t.Fatalf("new leader: %d entries, read %v changes; want 50 from the warm standby and none to read",
			st.Scheduled, counter(t, b.m.rebuildChanges))
	}
	h.clk.Add(31 * time.Minute)
	got := h.waitSent(1)
	if got[0].Pod != dpod("web-0") {
		t.Fatalf("after failover: %+v", got)
	}
}

// step advances the clock by d and waits until every replica has run a lease round.
func step(t *testing.T, h *harness, d time.Duration, reps ...*replica) {
	t.Helper()
	before := make([]uint64, len(reps))
	for i, r := range reps {
		before[i] = r.Lease().Rounds()
	}
	h.clk.Add(d)
	for i, r := range reps {
		testkit.Eventually(t, r.opts.Instance+" lease round", func() bool { return r.Lease().Rounds() > before[i] })
	}
}
