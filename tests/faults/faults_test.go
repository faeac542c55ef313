package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// TestClusterNodeLoss kills, in turn, the node leading the event stream, the
// JetStream meta leader and a node leading neither, each while the pod is watched at
// its SDS socket and forced to renew, then starts it again. After each: the pod
// never served an expired certificate, a new one was signed and served (time to heal
// logged), every record the stream held is still there, every certificate the pod
// served has its cert.issued there, and the served chain verifies to the current
// root. Events seen on the bus but never stored (dropped by their publisher) are
// logged, and fail the test unless MESHAGENT_FAULTS_STRICT=0 (docs/reliability.md).
//
// A node is stopped with Server.Shutdown: its routes close at once, unlike the
// compose suite's docker kill, whose peers only notice missing heartbeats.
func TestClusterNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster and the service binaries (about a minute)")
	}
	c, nc, ledger := startWatchedCluster(t)
	f := startFleet(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	watch := faultcheck.WatchPod(ctx, f.socket, "faults~"+pod, "", 100*time.Millisecond)

	began := time.Now()
	testkit.EventuallyWithin(t, time.Minute, "the pod's first certificate over SDS", func() bool {
		f.alive(t)
		return watch.Now().Cur.Leaf != nil
	})
	t.Logf("first certificate served %s after the services started", time.Since(began).Round(10*time.Millisecond))
	whole(t, nc)

	for _, which := range []string{"stream leader", "meta leader", "follower"} {
		t.Run(which, func(t *testing.T) {
			node := pick(t, c, nc, which)
			before := watch.Now().Cur.Serial()
			counts := ledger.Counts()
			start := time.Now()
			c.kill(node)
			var healed time.Time
			last := time.Time{}
			testkit.EventuallyWithin(t, time.Minute, "a new certificate served with "+node+" down", func() bool {
				f.alive(t)
				if time.Since(last) > time.Second { // a renew-due, as the rotator would send
					_ = faultcheck.ForceRenew(nc, events.PodRef{Namespace: "default", Name: pod})
					last = time.Now()
				}
				s := watch.Now()
				healed = s.At
				return s.Up && s.Cur.Serial() != before && !s.Expired()
			})
			if at, ok := watch.FirstServed(watch.Now().Cur.Serial()); ok {
				healed = at
			}
			// The loss shows in the signer's metrics (polled every 15 s) while the node is down.
			testkit.EventuallyWithin(t, time.Minute, "the signer reporting the event stream's lost replica", func() bool {
				f.alive(t) // a dead signer reports nothing: say so, not "timed out"
				_, body := testkit.HTTPGet("http://" + f.signerHTTP[0] + "/metrics")
				return metricValue(body, `meshagent_signer_stream_replicas_unhealthy{stream="`+events.StreamEvents+`"}`) >= 1
			})
			c.start(node)
			whole(t, nc)
			f.alive(t)
			testkit.EventuallyWithin(t, time.Minute, "the signer reporting the event stream whole again", func() bool {
				f.alive(t)
				_, body := testkit.HTTPGet("http://" + f.signerHTTP[0] + "/metrics")
				return strings.Contains(body, `meshagent_signer_stream_replicas_unhealthy{stream="`+events.StreamEvents+`"} 0`)
			})

			samples := watch.Since(start)
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
			if len(dropped) > 0 { // issue 10: publishers must keep and resend them
				if faultcheck.Strict() {
					t.Errorf("events dropped by their publishers (seen on the bus, never stored): %v", faultcheck.ByKind(dropped))
				} else {
					t.Logf("GUARANTEE BROKEN (not asserted: %s=0): events dropped by their publishers: %v",
						faultcheck.StrictEnv, faultcheck.ByKind(dropped))
				}
			}
			for sn := range served {
				if !ledger.HasIssued(sn) {
					t.Errorf("the pod served %s, which has no cert.issued in the stream", sn)
				}
			}
			if e := faultcheck.MeasureExpiry(samples, nil); e.Served > 0 {
				t.Errorf("the pod served an expired certificate for %s", e.Served)
			}
			checkChain(t, nc, watch)
			t.Logf("%s (%s) killed: new certificate served %s later; stream %s%s", which, node,
				healed.Sub(start).Round(10*time.Millisecond), faultcheck.Diff(counts, ledger.Counts()), refused(excused))
		})
	}
}

// pick names the node to kill: the event stream's leader, the meta leader, or a node
// that leads neither.
func pick(t *testing.T, c *cluster, nc *nats.Conn, which string) string {
	t.Helper()
	var stream, meta string
	testkit.EventuallyWithin(t, 30*time.Second, "the stream and meta leaders", func() bool {
		info, err := faultcheck.EventStream(nc)
		if err != nil || info.Cluster == nil {
			return false
		}
		stream, meta = info.Cluster.Leader, c.metaLeader()
		return stream != "" && meta != ""
	})
	switch which {
	case "stream leader":
		return stream
	case "meta leader":
		return meta
	}
	for _, n := range c.names {
		if n != stream && n != meta {
			return n
		}
	}
	t.Fatalf("no node leads neither (stream %s, meta %s)", stream, meta)
	return ""
}

// whole waits until the event stream is led and replicated on all three nodes.
func whole(t *testing.T, nc *nats.Conn) {
	t.Helper()
	testkit.EventuallyWithin(t, time.Minute, "the event stream current on three nodes", func() bool {
		return faultcheck.StreamWhole(nc, 2) == nil
	})
}

// checkChain: the pod serves every root of the signers' bundle and a leaf under it.
func checkChain(t *testing.T, nc *nats.Conn, watch *faultcheck.PodWatch) {
	t.Helper()
	ctx, cancel := bundleCtx()
	defer cancel()
	b, err := faultcheck.Bundle(ctx, nc)
	if err != nil {
		t.Fatalf("trust bundle: %v", err)
	}
	roots, err := pki.ParseCertPEMs(b.Roots)
	if err != nil {
		t.Fatal(err)
	}
	s := watch.Now()
	if !s.Cur.HoldsAll(roots) {
		t.Errorf("the pod's ROOTCA lacks a root of the bundle")
	}
	if err := s.Cur.ChainsTo(roots, time.Now()); err != nil {
		t.Errorf("the served certificate %s does not chain to the current root: %v", s.Cur.Serial(), err)
	}
}

func refused(excused []faultcheck.Seen) string {
	if len(excused) == 0 {
		return ""
	}
	return fmt.Sprintf("; %d cert.issued refused by the stream (their CSRs failed and were retried)", len(excused))
}
