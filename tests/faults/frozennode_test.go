package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// frozenFor is how long TestFrozenStreamLeader keeps the node frozen at least: past
// the nodes' ping eviction of its routes and clients (pingInterval x (pingMax+1)),
// the clients' own (5 s x 2), and a leader election.
const frozenFor = 30 * time.Second

// TestFrozenStreamLeader freezes (SIGSTOP) the NATS node leading the event stream — a
// nats-server process of its own, built from the module — for frozenFor while the pod
// is told to renew every second, then resumes it. The other two elect a new leader,
// every client on the frozen node moves to another once its pings go unanswered, and
// the pod renews before its certificate expires; the signers report the stream's lost
// replica (meshagent_signer_stream_replicas_unhealthy) while the node is frozen, and
// the stream whole once it is back. After it: no expired certificate served, no
// certificate issued for the pod that it never received (the requests the node held
// are delivered at resume, with their deadlines passed, and dropped), nothing lost by
// the stream or dropped by a publisher, and the served chain to the current root.
func TestFrozenStreamLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster as processes and the service binaries")
	}
	c := newProcessCluster(t)
	c.startAll(c.names...)
	// The test's own connection pings every second, so that it leaves the frozen node
	// in seconds.
	nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	testkit.EventuallyWithin(t, time.Minute, "a JetStream meta leader", func() bool { return c.metaLeader() != "" })
	ledger, err := faultcheck.NewLedger(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Two signers, each on a node of its own choosing, as the pod and the rotator.
	f := startFleetAs(t, c, layout{signers: []string{c.urls(), c.urls()}, pod: c.urls()})
	watch := watchReadyFleet(t, f, nc)
	unhealthy := func() (worst int) {
		for _, a := range f.signerHTTP {
			_, body := testkit.HTTPGet("http://" + a + "/metrics")
			worst = max(worst, metricValue(body, `meshagent_signer_stream_replicas_unhealthy{stream="`+events.StreamEvents+`"}`))
		}
		return worst
	}

	node := pick(t, c, nc, "stream leader")
	before := watch.Now().Cur.Serial()
	start := time.Now()
	c.freeze(node)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			c.resume(node)
		}
	})

	var healed time.Time
	last := time.Time{}
	renew := func() {
		if time.Since(last) > time.Second { // a renew-due, as the rotator would send
			_ = faultcheck.ForceRenew(nc, events.PodRef{Namespace: "default", Name: pod})
			last = time.Now()
		}
	}
	testkit.EventuallyWithin(t, time.Minute, "a new certificate served with "+node+" frozen", func() bool {
		f.alive(t)
		renew()
		s := watch.Now()
		return s.Up && s.Cur.Serial() != before && !s.Expired()
	})
	if at, ok := watch.FirstServed(watch.Now().Cur.Serial()); ok {
		healed = at
	}
	var next string
	testkit.EventuallyWithin(t, time.Minute, "a new stream leader", func() bool {
		info, err := faultcheck.EventStream(nc)
		if err == nil && info.Cluster != nil {
			next = info.Cluster.Leader
		}
		return next != "" && next != node
	})
	// Frozen for frozenFor, and until a signer has reported the lost replica (its
	// quorum watch asks every 15 s); the pod keeps renewing meanwhile.
	var reported time.Duration
	testkit.EventuallyWithin(t, frozenFor+time.Minute, "the signers reporting the event stream's frozen replica", func() bool {
		f.alive(t)
		renew()
		if reported == 0 && unhealthy() >= 1 {
			reported = time.Since(start)
		}
		return reported > 0 && time.Since(start) >= frozenFor
	})
	frozen := time.Since(start)
	c.resume(node)
	resumed = true
	back := time.Now()
	whole(t, nc)
	testkit.EventuallyWithin(t, time.Minute, "the signers reporting the event stream whole again", func() bool {
		f.alive(t)
		return unhealthy() == 0
	})
	wholeAfter := time.Since(back)

	if err := ledger.Sync(30 * time.Second); err != nil {
		t.Fatalf("read the event stream: %v", err)
	}
	served := watch.ServedSince(start)
	dropped, excused, err := ledger.SettleUnstored(start, 10*time.Second, func(s faultcheck.Seen) bool {
		return s.Type == events.TypeCertIssued && !served[s.Key] // its CSR failed: nobody got it
	})
	if err != nil {
		t.Fatalf("read the event stream: %v", err)
	}
	if err := ledger.Recheck(); err != nil {
		t.Errorf("a record lost by the stream: %v", err)
	}
	if len(dropped) > 0 {
		t.Errorf("events dropped by their publishers (seen on the bus, never stored): %v", faultcheck.ByKind(dropped))
	}
	// served was read before the stream was settled (up to 10 s): a scheduled
	// renewal issued meanwhile reaches the pod after that look. Look again, giving
	// a certificate issued in the last seconds the time to be served.
	ref := events.PodRef{Namespace: "default", Name: pod}
	testkit.Poll(10*time.Second, func() bool {
		served = watch.ServedSince(start)
		for _, i := range ledger.IssuedSince(start, ref) {
			if !served[i.Serial] && time.Since(i.At) < 10*time.Second {
				return false
			}
		}
		return true
	})
	var unreceived []string
	for _, i := range ledger.IssuedSince(start, ref) {
		if !served[i.Serial] {
			unreceived = append(unreceived, i.Serial+" by "+i.Signer+" at "+i.At.Format("15:04:05.000"))
		}
	}
	if len(unreceived) > 0 {
		t.Errorf("certificates issued for the pod that it never received: %s", strings.Join(unreceived, ", "))
	}
	for sn := range served {
		if !ledger.HasIssued(sn) {
			t.Errorf("the pod served %s, which has no cert.issued in the stream", sn)
		}
	}
	if e := faultcheck.MeasureExpiry(watch.Since(start), nil); e.Served > 0 {
		t.Errorf("the pod served an expired certificate for %s", e.Served)
	}
	checkChain(t, nc, watch)
	f.alive(t)
	t.Logf("stream leader %s frozen %s (new leader %s): the pod's first new certificate served %s after the freeze, %d certificates served in all; the lost replica reported %s after the freeze; whole and reported so %s after resume; 0 issued that the pod never received%s",
		node, frozen.Round(10*time.Millisecond), next, healed.Sub(start).Round(10*time.Millisecond), len(served),
		reported.Round(10*time.Millisecond), wholeAfter.Round(10*time.Millisecond), refused(excused))
}
