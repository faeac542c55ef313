//go:build compose

package compose

import (
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

// strict (faultcheck.StrictEnv; on unless MESHAGENT_FAULTS_STRICT=0) asserts the
// guarantees issue 10 delivered, which MESHAGENT_FAULTS_STRICT=0 only measures and
// logs:
//   - no certificate served past its expiry while a signer is reachable by some path;
//   - when none is, /readyz says so within a second of expiry;
//   - no event dropped by its publisher: every event seen on the bus is stored in the
//     stream once the stack has healed (a cert.issued the stream refused excepted:
//     its signer fails the CSR, so no one holds that certificate).
//
// (docs/reliability.md). Either way the suite asserts healing, no record lost by the stream, a cert.issued in the stream
// for every certificate the pod served, and a served chain to the current root.
var strict = faultcheck.Strict()

// probeEvery is how often the pod's /readyz and what it serves are sampled.
const probeEvery = 250 * time.Millisecond

// readyLagMax is the readiness guarantee plus the probe's resolution.
const readyLagMax = time.Second + probeEvery

// backAllowance is how long after a signer becomes reachable again an expired
// certificate may still be served: issue 10's "with the CA back, default is served
// again within 2 s" (pilot-agent: 1.1 s).
const backAllowance = 2 * time.Second

// fault is one scenario: when it began and was lifted, when no signer was reachable
// from the pod by any path, and what was measured.
type fault struct {
	name         string
	start        time.Time
	noSigner     []faultcheck.Window
	serialBefore string
	countsBefore map[string]int
	// busDown: the fault stops the NATS cluster together with the pod (a restart of
	// everything at once), so the pod's last words (pod.down) have no stream to go to.
	busDown bool
	// noUnreceived: the fault (a gray one, issue 25) is also held to "no certificate
	// issued for the pod that it never received", counted from the stream's
	// cert.issued records, which the ledger sees even when its own connection was
	// on a frozen node.
	noUnreceived bool

	heal     time.Duration // to a new, valid certificate served
	healFrom string        // what heal counts from
	expiry   faultcheck.Expiry
	stream   string // events the stream gained
	notes    []string
}

func (f *fault) note(format string, args ...any) {
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

// harness is the suite's view of its stack: the admin's connection, the pod probe,
// the event ledger and the figures of every fault.
type harness struct {
	st     *stack
	nc     *nats.Conn
	probe  *faultcheck.PodWatch
	ledger *faultcheck.Ledger
	faults []*fault
}

// sync reads the event stream up to now.
func (h *harness) sync(t *testing.T) {
	t.Helper()
	if err := h.ledger.Sync(2 * time.Minute); err != nil {
		t.Fatalf("read the event stream: %v", err)
	}
}

// begin starts a fault's record: the stream read up to now, the pod's serial.
func (h *harness) begin(t *testing.T, name string) *fault {
	t.Helper()
	h.sync(t)
	f := &fault{name: name, start: time.Now(), serialBefore: h.probe.Now().Cur.Serial(), countsBefore: h.ledger.Counts()}
	h.faults = append(h.faults, f)
	t.Logf("%s: begins, pod serves %s", name, f.serialBefore)
	return f
}

// hold keeps a fault in place for d: the fault's duration, not a wait for a condition.
func hold(d time.Duration) { time.Sleep(d) }

// healed waits (up to limit) until the pod serves a certificate other than the one
// it served when the fault began, unexpired, and records the time since from. nudge,
// if not nil, runs every second meanwhile (a forced renewal).
func (h *harness) healed(t *testing.T, f *fault, from time.Time, what string, limit time.Duration, nudge func()) faultcheck.Sample {
	t.Helper()
	var got faultcheck.Sample
	last := time.Time{}
	testkit.EventuallyWithin(t, limit, f.name+": a new certificate served", func() bool {
		if nudge != nil && time.Since(last) > time.Second {
			nudge()
			last = time.Now()
		}
		got = h.probe.Now()
		return got.Up && got.Cur.Leaf != nil && got.Cur.Serial() != f.serialBefore && !got.Expired()
	})
	if at, ok := h.probe.FirstServed(got.Cur.Serial()); ok {
		got.At = at
	}
	f.heal, f.healFrom = got.At.Sub(from), what
	t.Logf("%s: new certificate %s served %s after %s (expires %s)", f.name, got.Cur.Serial(),
		f.heal.Round(10*time.Millisecond), what, got.Cur.Leaf.NotAfter.Format(time.TimeOnly))
	return got
}

// signersBack waits until a signer answers on the bus and returns when.
func (h *harness) signersBack(t *testing.T) time.Time {
	t.Helper()
	bundle(t, h.nc)
	return time.Now()
}

// end checks what must hold after every fault and records the figures: every record
// the stream held still there (nothing lost by the stream), every certificate the
// pod served recorded there, the served chain verifying to the current root; then
// events dropped by their publishers (seen on the bus, never stored), expiry and
// readiness.
func (h *harness) end(t *testing.T, f *fault) {
	t.Helper()
	samples := h.probe.Since(f.start)
	served := h.probe.ServedSince(f.start)
	// A cert.issued the stream refused fails its CSR (the signer hands out no
	// certificate it could not record): not lost, as long as nobody got it. When the
	// whole cluster stops with the pod, a pod.down seen on the bus has no stream to be
	// stored in and no process left to resend it: counted apart, not as a drop.
	dropped, excused, err := h.ledger.SettleUnstored(f.start, 15*time.Second, func(s faultcheck.Seen) bool {
		return (f.busDown && s.Type == events.TypePodDown) || (s.Type == events.TypeCertIssued && !served[s.Key])
	})
	if err != nil {
		t.Fatalf("%s: read the event stream: %v", f.name, err)
	}
	if err := h.ledger.Recheck(); err != nil {
		t.Errorf("%s: a record lost by the stream: %v", f.name, err)
	}
	if n := faultcheck.ByKind(excused); len(excused) > 0 {
		f.note("excused, never stored: %v (a cert.issued the stream refused failed its CSR; a pod.down sent as the whole cluster stopped had no stream)", n)
	}
	f.stream = faultcheck.Diff(f.countsBefore, h.ledger.Counts())
	for sn := range served {
		if !h.ledger.HasIssued(sn) {
			t.Errorf("%s: the pod served %s, which has no cert.issued in the stream", f.name, sn)
		}
	}
	h.checkChain(t, f)
	var unreachable []faultcheck.Window
	for _, w := range f.noSigner {
		unreachable = append(unreachable, faultcheck.Window{From: w.From, To: w.To.Add(backAllowance)})
	}
	f.expiry = faultcheck.MeasureExpiry(samples, unreachable)
	unused := 0
	for _, s := range h.ledger.SeenSince(f.start) {
		if s.Type == events.TypeCertIssued && !served[s.Key] && h.ledger.Stored(s.ID) {
			unused++
		}
	}
	if unused > 0 {
		f.note("%d certificates issued for the pod never served", unused)
	}

	e := f.expiry
	msg := fmt.Sprintf("%s: heal %s (from %s); expired served %s (%s while a signer was reachable, after %s allowed); readiness lag %s; stream %s",
		f.name, f.heal.Round(10*time.Millisecond), f.healFrom, e.Served.Round(10*time.Millisecond),
		e.Reachable.Round(10*time.Millisecond), backAllowance, lagText(e.ReadyLag), f.stream)
	if len(f.notes) > 0 {
		msg += "; " + strings.Join(f.notes, "; ")
	}
	t.Log(msg)
	var gaps []string
	if len(dropped) > 0 {
		gaps = append(gaps, fmt.Sprintf("events dropped by their publishers (seen on the bus, never stored): %v", faultcheck.ByKind(dropped)))
		f.note("dropped by publishers: %v", faultcheck.ByKind(dropped))
	}
	if f.noUnreceived {
		// served was read before the stream was settled, which can take seconds:
		// a renewal issued meanwhile (the rotator's schedule goes on) reaches the
		// pod after that first look. Look again, giving a certificate issued in
		// the last seconds the time to be served.
		testkit.Poll(10*time.Second, func() bool {
			served = h.probe.ServedSince(f.start)
			for _, i := range h.ledger.IssuedSince(f.start, podRef) {
				if !served[i.Serial] && time.Since(i.At) < 10*time.Second {
					return false
				}
			}
			return true
		})
		var signerLogs string
		withheld := 0
		for _, i := range h.ledger.IssuedSince(f.start, podRef) {
			if served[i.Serial] {
				continue
			}
			// The signer stores the pod's issued record, then cert.issued, and hands
			// the certificate out only when both are stored; when the record fails
			// no cert.issued is written. cert.issued can still be in the history of
			// a certificate given to no one when the stream stored it but its ack
			// was lost (a leader frozen after storing): the signer then logged
			// "record cert.issued failed" for it.
			if signerLogs == "" {
				for _, s := range []string{"signer-1", "signer-2"} {
					signerLogs += h.st.logsSince(t, s, time.Since(f.start)+time.Minute)
				}
			}
			if strings.Contains(signerLogs, "record cert.issued failed: serial="+i.Serial) {
				withheld++
				continue
			}
			gaps = append(gaps, fmt.Sprintf("certificate %s issued by %s over %s at %s, which the pod never received",
				i.Serial, i.Signer, i.Transport, i.At.Format("15:04:05.000")))
		}
		if withheld > 0 {
			f.note("%d cert.issued in the history for certificates their signer withheld (its issued record not stored in time: it handed them to no one)", withheld)
		}
	}
	if e.Reachable > 0 {
		gaps = append(gaps, fmt.Sprintf("an expired certificate was served %s while a signer was reachable", e.Reachable.Round(10*time.Millisecond)))
	}
	if e.ReadyLag == faultcheck.Never || e.ReadyLag > readyLagMax {
		gaps = append(gaps, fmt.Sprintf("readiness said nothing of the expired certificate within %s (%s)", readyLagMax, lagText(e.ReadyLag)))
	}
	for _, g := range gaps {
		if strict {
			t.Errorf("%s: %s", f.name, g)
		} else {
			t.Logf("%s: GUARANTEE BROKEN (not asserted: MESHAGENT_FAULTS_STRICT=0): %s", f.name, g)
		}
	}
}

func lagText(d time.Duration) string {
	switch {
	case d == faultcheck.Never:
		return "never (ready throughout)"
	case d == 0:
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}

// checkChain: the pod's served leaf verifies to a root of the current trust bundle,
// and the pod's ROOTCA holds the bundle's newest root.
func (h *harness) checkChain(t *testing.T, f *fault) {
	t.Helper()
	b := bundle(t, h.nc)
	roots, err := pki.ParseCertPEMs(b.Roots)
	if err != nil {
		t.Fatalf("%s: bundle roots: %v", f.name, err)
	}
	var cur faultcheck.Sample
	testkit.EventuallyWithin(t, 30*time.Second, f.name+": the pod's ROOTCA holds every root of the bundle", func() bool {
		cur = h.probe.Now()
		return cur.Cur.HoldsAll(roots)
	})
	if err := cur.Cur.ChainsTo(roots, time.Now()); err != nil {
		t.Errorf("%s: the served certificate %s does not chain to the current roots: %v", f.name, cur.Cur.Serial(), err)
	}
}

// streamLeader is the node leading the event stream.
func (h *harness) streamLeader(t *testing.T) string {
	t.Helper()
	var leader string
	testkit.EventuallyWithin(t, time.Minute, "the event stream's leader", func() bool {
		info, err := faultcheck.EventStream(h.nc)
		if err != nil || info.Cluster == nil {
			return false
		}
		leader = info.Cluster.Leader
		return leader != ""
	})
	return leader
}

// clusterWhole waits until the event stream has a leader and two current replicas.
func (h *harness) clusterWhole(t *testing.T) {
	t.Helper()
	testkit.EventuallyWithin(t, 2*time.Minute, "the event stream on three current nodes", func() bool {
		return faultcheck.StreamWhole(h.nc, 2) == nil
	})
}

// restarts is the sds-edge container's restart count and start time.
func (h *harness) restarts(t *testing.T) string {
	t.Helper()
	return docker(t, "inspect", "-f", "{{.RestartCount}} {{.State.StartedAt}}", h.st.container(t, "sds-edge"))
}

// podUpSince reports whether the stream holds a pod.up of the pod published after t.
func (h *harness) podUpSince(t *testing.T, since time.Time) bool {
	t.Helper()
	h.sync(t)
	for _, s := range h.ledger.SeenSince(since) {
		if s.Type == events.TypePodUp && h.ledger.Stored(s.ID) {
			return true
		}
	}
	return false
}

// report prints every fault's figures as one markdown table (docs/reliability.md).
func (h *harness) report(t *testing.T) {
	var b strings.Builder
	b.WriteString("\n| fault | heal | from | expired served (signer reachable) | readiness lag | stream gained | notes |\n|---|---|---|---|---|---|---|\n")
	for _, f := range h.faults {
		fmt.Fprintf(&b, "| %s | %s | %s | %s (%s) | %s | %s | %s |\n", f.name, f.heal.Round(10*time.Millisecond), f.healFrom,
			f.expiry.Served.Round(10*time.Millisecond), f.expiry.Reachable.Round(10*time.Millisecond), lagText(f.expiry.ReadyLag),
			f.stream, strings.Join(f.notes, "; "))
	}
	t.Log(b.String())
}
