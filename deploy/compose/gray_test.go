//go:build compose

package compose

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
)

// The gray faults of issue 25: parts that hang instead of dying (docker pause: the
// container's processes frozen, its sockets open, its peers noticing only by missing
// pings) and a node whose JetStream store is full. Each is held to the guarantees of
// every fault (harness.end) and to one more: no certificate issued for the pod that
// the pod never received (fault.noUnreceived).

// natsLeaderPaused: the NATS node leading the event stream frozen for 40 s while the
// pod is told to renew every second until it has a new certificate, then resumed.
// The other two nodes elect a new leader, clients on the frozen node move to another
// once its pings go unanswered, and sds-edge signs through them (or over gRPC,
// CA_FALLBACK_ADDR); at unpause the node finds its routes and clients gone and
// delivers what it held, which the signers drop (its deadlines passed).
func natsLeaderPaused(t *testing.T, h *harness) {
	h.clusterWhole(t)
	node := h.streamLeader(t)
	f := h.begin(t, "stream leader's node paused 40s")
	f.noUnreceived = true
	f.note("paused %s", node)
	h.st.compose(t, "pause", node)
	paused := time.Now()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_, _ = h.st.tryCompose("unpause", node)
		}
	})
	h.healed(t, f, paused, "pause", 2*time.Minute, func() { forceRenew(t, h.nc) })
	var next string
	testkit.EventuallyWithin(t, time.Minute, "a new stream leader", func() bool { next = h.streamLeader(t); return next != node })
	f.note("new stream leader %s", next)
	hold(time.Until(paused.Add(40 * time.Second)))
	h.st.compose(t, "unpause", node)
	resumed = true
	unpaused := time.Now()
	h.clusterWhole(t)
	// What the node held (requests, publishes, routed messages) is delivered or
	// dropped now: give the signers time to answer or drop it before counting.
	hold(time.Until(unpaused.Add(20 * time.Second)))
	f.note("the stream whole again %s after unpause", time.Since(unpaused).Round(100*time.Millisecond))
	h.end(t, f)
}

// sdsEdgePaused: the pod's sds-edge frozen for 30 s, half its certificate's life,
// starting right after a renewal (so that no sign request of its own is in flight:
// a requester frozen after sending can still be signed for). Meanwhile its NATS node
// drops the frozen connection (3 s pings) and the rotator's renew-due finds no one;
// at unpause sds-edge reconnects, serves again, and renews by itself before expiry.
func sdsEdgePaused(t *testing.T, h *harness) {
	f := h.begin(t, "sds-edge paused 30s")
	f.noUnreceived = true
	fresh := h.healed(t, f, f.start, "forced renewal", time.Minute, func() { forceRenew(t, h.nc) })
	// The renewals the nudges asked for come to an end: the served serial holds for 2 s.
	serial, since := fresh.Cur.Serial(), time.Now()
	testkit.EventuallyWithin(t, 30*time.Second, "no renewal in flight", func() bool {
		if s := h.probe.Now().Cur.Serial(); s != serial {
			serial, since = s, time.Now()
		}
		return time.Since(since) > 2*time.Second
	})
	f.serialBefore = serial
	h.st.compose(t, "pause", "sds-edge")
	paused := time.Now()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_, _ = h.st.tryCompose("unpause", "sds-edge")
		}
	})
	hold(30 * time.Second)
	h.st.compose(t, "unpause", "sds-edge")
	resumed = true
	unpaused := time.Now()
	testkit.EventuallyWithin(t, 30*time.Second, "sds-edge's /readyz answering again", func() bool {
		code, _ := testkit.HTTPGetWithin(h.st.podReady, faultcheck.ProbeTimeout)
		return code != 0
	})
	f.note("/readyz answered %s after unpause", time.Since(unpaused).Round(10*time.Millisecond))
	h.healed(t, f, unpaused, "unpause", 90*time.Second, nil)
	f.note("paused %s", unpaused.Sub(paused).Round(100*time.Millisecond))
	h.end(t, f)
}

// smallStore is the size of the tmpfs the full-store fault gives a NATS node: room
// for the suite's streams and buckets, filled on purpose once they are current.
const smallStore = "64m"

// natsStoreFull: a NATS node leading neither the event stream nor the meta group is
// given a small JetStream store (a tmpfs volume, recreated empty: it catches up from
// its peers), which is then filled to the last byte while the pod is told to renew.
// nats-server disables JetStream on that node at its next failed write; the R3
// streams and buckets go on with two replicas, and that must be reported before a
// second loss stops signing: the signers' and rotators'
// meshagent_*_stream_replicas_unhealthy and `meshctl status` ("DEGRADED"). The pod
// keeps its guarantees throughout. Then the node restarts on an empty store (the tmpfs
// is new at each start: the space freed) and the cluster is whole and reported so.
//
// It leaves the node on the tmpfs: it runs last.
func natsStoreFull(t *testing.T, h *harness) {
	h.clusterWhole(t)
	node := h.leadingNeither(t)
	f := h.begin(t, "a NATS node's store full")
	f.noUnreceived = true
	f.note("%s on a %s tmpfs", node, smallStore)
	volume := "store-full"
	override := filepath.Join(t.TempDir(), "store-full.yaml")
	if err := os.WriteFile(override, fmt.Appendf(nil, `version: "3.8"
services:
  %s:
    volumes: ["%s:/data"]
volumes:
  %s:
    driver_opts: {type: tmpfs, device: tmpfs, o: "size=%s"}
`, node, volume, volume, smallStore), 0o644); err != nil {
		t.Fatal(err)
	}
	h.st.extraVolumes = append(h.st.extraVolumes, project+"_"+volume)
	h.st.compose(t, "-f", override, "up", "-d", "--no-deps", node)
	moved := time.Now()
	h.clusterWhole(t)
	f.note("the event stream current on three nodes %s after the recreate", time.Since(moved).Round(100*time.Millisecond))

	filler := filepath.Join(t.TempDir(), "filler")
	if err := os.WriteFile(filler, make([]byte, 64<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f.serialBefore = h.probe.Now().Cur.Serial()
	out, err := exec.Command("docker", "cp", filler, h.st.container(t, node)+":/data/filler").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no space left on device") {
		t.Fatalf("filling %s's store: want it full (no space left on device), got %v: %s", node, err, out)
	}
	full := time.Now()
	// The next write to any stream it replicates (a renewal every 5 s: the signers
	// bound re-issues per pod, 10 a minute) fails there.
	var nudged time.Time
	testkit.EventuallyWithin(t, 2*time.Minute, node+" disabling JetStream (its store full)", func() bool {
		if time.Since(nudged) > 5*time.Second {
			forceRenew(t, h.nc)
			nudged = time.Now()
		}
		return strings.Contains(h.st.logsSince(t, node, time.Since(moved)+time.Minute), "JetStream out of resources, will be DISABLED")
	})
	f.note("JetStream disabled on %s %s after its store filled", node, time.Since(full).Round(100*time.Millisecond))
	h.healed(t, f, full, "store full", time.Minute, func() { forceRenew(t, h.nc) })

	// Reported: the signers' and rotators' gauges (their quorum watch asks every 15 s)
	// and meshctl status.
	var reported []string
	testkit.EventuallyWithin(t, 2*time.Minute, "the degraded quorum reported by signers, rotators and meshctl status", func() bool {
		reported = reported[:0]
		for _, svc := range []string{"signer-1", "signer-2", "rotator-1", "rotator-2"} {
			if n := h.unhealthyReplicas(t, svc, events.StreamEvents); n >= 1 {
				reported = append(reported, fmt.Sprintf("%s: %d", svc, n))
			}
		}
		status := h.meshctlStatus(t)
		degraded := strings.Contains(status, "DEGRADED "+events.StreamEvents)
		return len(reported) == 4 && degraded
	})
	f.note("reported %s after the store filled (%s; meshctl status DEGRADED %s)", time.Since(full).Round(100*time.Millisecond),
		strings.Join(reported, ", "), events.StreamEvents)
	for _, l := range strings.Split(h.meshctlStatus(t), "\n") {
		if strings.Contains(l, "DEGRADED") || strings.Contains(l, "degraded") {
			t.Logf("meshctl status: %s", strings.TrimSpace(l))
		}
	}

	// Free the space: the node restarts on a new tmpfs, empty, and catches up.
	h.st.compose(t, "restart", node)
	restarted := time.Now()
	h.clusterWhole(t)
	testkit.EventuallyWithin(t, 2*time.Minute, "the quorum reported whole again", func() bool {
		for _, svc := range []string{"signer-1", "signer-2", "rotator-1", "rotator-2"} {
			if h.unhealthyReplicas(t, svc, events.StreamEvents) != 0 {
				return false
			}
		}
		return !strings.Contains(h.meshctlStatus(t), "DEGRADED")
	})
	f.note("whole again, and reported so, %s after the restart", time.Since(restarted).Round(100*time.Millisecond))
	h.end(t, f)
}

// leadingNeither is a NATS node that leads neither the event stream nor the
// JetStream meta group.
func (h *harness) leadingNeither(t *testing.T) string {
	t.Helper()
	stream, meta := h.streamLeader(t), h.st.metaLeader(t)
	for _, n := range natsNodes {
		if n != stream && n != meta {
			return n
		}
	}
	t.Fatalf("every node leads (stream %s, meta %s)", stream, meta)
	return ""
}

// unhealthyReplicas reads service's meshagent_<kind>_stream_replicas_unhealthy for
// stream from its /metrics on the compose network (the host reaches container
// addresses); -2 when it cannot be read.
func (h *harness) unhealthyReplicas(t *testing.T, service, stream string) int {
	t.Helper()
	port, kind := "15014", "signer"
	if strings.HasPrefix(service, "rotator") {
		port, kind = "15093", "rotator"
	}
	ip := docker(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", h.st.container(t, service))
	ip, _, _ = strings.Cut(ip, " ")
	code, body := testkit.HTTPGet("http://" + ip + ":" + port + "/metrics")
	if code != 200 {
		return -2
	}
	m := regexp.MustCompile(`meshagent_` + kind + `_stream_replicas_unhealthy\{stream="` + regexp.QuoteMeta(stream) + `"\} (-?\d+)`).FindStringSubmatch(body)
	if m == nil {
		return -2
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// meshctlStatus runs `meshctl status` as the admin, from the suite's meshctl image on
// the compose network, and returns what it printed (it exits non-zero when something
// needs attention, which a degraded stream does).
func (h *harness) meshctlStatus(t *testing.T) string {
	t.Helper()
	var urls []string
	for _, n := range natsNodes {
		urls = append(urls, "tls://"+n+":4222")
	}
	out, _ := exec.Command("docker", "run", "--rm", "--network", project+"_default", "-v", h.st.secrets+":/s:ro",
		"meshagent/meshctl:dev", "status", "-nats-url", strings.Join(urls, ","), "-nats-nkey", "/s/admin.nk",
		"-nats-tls-ca", "/s/ca.pem").CombinedOutput()
	return string(out)
}
