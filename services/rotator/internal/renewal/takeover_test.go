package renewal

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestTakeoverTrustsTheKeptBundle: a replica taking over leadership used to trust
// the first bundle it heard ("trusting the first trust bundle on first use"), so a
// responder on the bundle subject at that moment chose its roots. The leader keeps
// the bundle it checked in the schedule bucket; the next leader trusts that and
// checks what it hears against it: a forged bundle is not taken, and the records
// under the real root are scheduled (the positive control).
func TestTakeoverTrustsTheKeptBundle(t *testing.T) {
	h := newHarness(t)
	r0 := h.start(testOptions("r0"))
	waitLeader(t, r0)
	testkit.Eventually(t, "bundle trusted", func() bool { return r0.trust.Bootstrapped() })
	_, realFP := h.ca.root("root-a")
	if got := counter(t, r0.m.trustBootstrap.WithLabelValues("first-use")); got != 1 {
		t.Fatalf("the fleet's first leader: first-use %v", got)
	}
	r1 := h.start(testOptions("r1"))
	testkit.Eventually(t, "r1 follows", func() bool { return r1.Ready() == nil && !r1.Leader() })
	// From now on only a forger answers bundle requests.
	evil := newTestCA(t)
	evil.root("evil")
	evil.root("evil-2") // a newer generation than the real one
	_ = h.realBundle.Unsubscribe()
	evil.serveBundle(t, h.nc)
	r0.crash()
	for elapsed := time.Duration(0); !r1.Leader(); elapsed += r1.Lease().Period() {
		if elapsed > 2*r1.Lease().MaxFailover() {
			t.Fatalf("no failover after %v", elapsed)
		}
		step(t, h, r1.Lease().Period(), r1)
	}
	waitLeader(t, r1)
	testkit.Eventually(t, "r1 trusts a bundle", func() bool { return r1.trust.Bootstrapped() })
	if got := counter(t, r1.m.trustBootstrap.WithLabelValues("first-use")); got != 0 {
		t.Fatal("the replica taking over trusted the first bundle it heard")
	}
	if got := counter(t, r1.m.trustBootstrap.WithLabelValues("kept")); got != 1 {
		t.Fatalf("kept bundle not trusted: %v", got)
	}
	for _, name := range []string{"evil", "evil-2"} {
		if _, fp := evil.root(name); r1.trust.Has(fp) {
			t.Fatalf("the forger's root %s is trusted", name)
		}
	}
	if !r1.trust.Has(realFP) {
		t.Fatal("the real root is not trusted")
	}
	h.publish(events.SubjectCertIssued, h.issue("web-0", "1", h.clk.Now(), time.Hour, "root-a"))
	waitScheduled(t, r1, 1)
}
