package main

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkRealEvents is the rotator binary consuming cert.issued events that the
// real signer binary issued (meshctl bench sign, one pod-bound token per pod, so
// each event is a pod of its own), over a TCP nats-server with JetStream, and
// writing its schedule bucket. ROTATOR_BENCH_EVENTS pods (default 10,000).
//
//   - live: a rotator leads on an empty stream, then the signer issues; lag is,
//     per event, the bucket write's stream time minus the event's (server clock).
//   - backlog: a second rotator (its own consumer and buckets) starts on the
//     stream holding every event and catches up: events/s from its first to its
//     last bucket write; its CPU per event beyond what an empty start costs.
//   - where the time goes: the same events through the steps the rotator takes
//     for each, timed one by one in this process: decoding the envelope, parsing
//     and verifying the chain against the signer's bundle, and the bucket write
//     (a JetStream request and its reply).
func BenchmarkRealEvents(b *testing.B) {
	n := envInt("ROTATOR_BENCH_EVENTS", 10_000)
	for range b.N {
		st := startSignerStack(b, n)
		nc := bustest.Conn(b, st.ns)
		js := bustest.JetStream(b, nc)
		args := func(name string) []string {
			return []string{"-nats-url", st.ns.ClientURL(), "-instance", name, "-bucket", "bench_" + name,
				"-lease-bucket", "bench_" + name + "_lease", "-consumer", "bench_" + name, "-log-level", "warn"}
		}

		// Live: the rotator follows the signer as it issues.
		live := testkit.StartService(b, "rotator", args("live"))
		emptyCPU, emptyRSS := live.CPU(b), rssKB(b, live.Pid())
		sign := st.benchSign(b, n, "-warmup", "0")
		waitScheduled(b, live, n)
		liveCPU := live.CPU(b) - emptyCPU
		evTimes := eventTimes(b, js)
		liveWrites := bucketTimes(b, js, "bench_live")
		var lag []float64
		for pod, at := range liveWrites {
			if ev, ok := evTimes[pod]; ok {
				lag = append(lag, float64(at.Sub(ev).Microseconds())/1000)
			}
		}
		if len(lag) != n {
			b.Fatalf("%d of %d pods have both an event and a bucket entry", len(lag), n)
		}
		slices.Sort(lag)

		// Backlog: a fresh rotator reads every event from the stream.
		began := time.Now()
		backlog := testkit.StartService(b, "rotator", args("backlog")) // ready: caught up
		ready := time.Since(began)
		waitScheduled(b, backlog, n)
		backlogCPU := backlog.CPU(b) - emptyCPU // less what starting on an empty stream took
		writes := bucketTimes(b, js, "bench_backlog")
		first, last := span(writes)
		rate := float64(n) / last.Sub(first).Seconds()
		fullRSS := rssKB(b, backlog.Pid())

		steps := stepCosts(b, nc, js, n)

		b.ReportMetric(sign.Rate, "signer-events/s")
		b.ReportMetric(lag[len(lag)/2], "live-lag-p50-ms")
		b.ReportMetric(lag[len(lag)*99/100], "live-lag-p99-ms")
		b.ReportMetric(float64(liveCPU.Microseconds())/float64(n), "live-cpu-µs/event")
		b.ReportMetric(rate, "backlog-events/s")
		b.ReportMetric(float64(backlogCPU.Microseconds())/float64(n), "backlog-cpu-µs/event")
		b.ReportMetric(ready.Seconds(), "backlog-ready-s")
		b.ReportMetric((fullRSS-emptyRSS)*1024/float64(n), "rss-B/entry")
		b.ReportMetric(fullRSS/1024, "rss-MB")
		b.ReportMetric(steps.decode, "decode-µs/event")
		b.ReportMetric(steps.verify, "verify-µs/event")
		b.ReportMetric(steps.write, "kv-write-µs/event")
		b.ReportMetric(0, "ns/op")
		b.Logf("%d cert.issued from the real signer at %.0f/s; live: lag p50 %.2f ms, p99 %.2f ms, max %.1f ms, rotator CPU %.0f µs/event",
			n, sign.Rate, lag[len(lag)/2], lag[len(lag)*99/100], lag[len(lag)-1], float64(liveCPU.Microseconds())/float64(n))
		b.Logf("backlog: %d events in %v (%.0f events/s = bucket writes/s), ready after %v, CPU %.0f µs/event, RSS %.1f MB (%.0f B per entry over an empty start)",
			n, last.Sub(first).Round(time.Millisecond), rate, ready.Round(time.Millisecond),
			float64(backlogCPU.Microseconds())/float64(n), fullRSS/1024, (fullRSS-emptyRSS)*1024/float64(n))
		b.Logf("per event, one at a time in this process: decode %.1f µs, chain parse+verify %.1f µs, bucket write round trip %.1f µs (sum %.0f µs; the rotator's wall time per event in the backlog %.0f µs)",
			steps.decode, steps.verify, steps.write, steps.decode+steps.verify+steps.write, 1e6/rate)
	}
}

func rssKB(b *testing.B, pid int) float64 {
	kb, err := testkit.ProcStatusKB(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	return kb
}

// waitScheduled waits until the rotator has scheduled n certificates (its
// meshagent_rotator_scheduled gauge).
func waitScheduled(b *testing.B, svc *testkit.Service, n int) {
	want := "meshagent_rotator_scheduled " + strconv.Itoa(n)
	testkit.EventuallyWithin(b, 5*time.Minute, "rotator scheduled "+strconv.Itoa(n), func() bool {
		_, body := testkit.HTTPGet("http://" + svc.HTTPAddr + "/metrics")
		return strings.Contains(body, "\n"+want+"\n")
	})
}

// eventTimes reads every cert.issued event stored in the stream: the pod and the
// time the server stored it.
func eventTimes(b *testing.B, js jetstream.JetStream) map[string]time.Time {
	out := map[string]time.Time{}
	readStream(b, js, events.StreamEvents, events.SubjectCertIssued, func(m jetstream.Msg, at time.Time) {
		ev, _, err := events.Decode[events.CertIssued](&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		if err != nil {
			b.Fatalf("stored cert.issued: %v", err)
		}
		out[ev.Pod.String()] = at // as the schedule keys it: namespace/name
	})
	return out
}

// bucketTimes reads the schedule bucket's stream: each pod's first entry and the
// time the server stored it.
func bucketTimes(b *testing.B, js jetstream.JetStream, bucket string) map[string]time.Time {
	out := map[string]time.Time{}
	readStream(b, js, "KV_"+bucket, "", func(m jetstream.Msg, at time.Time) {
		if !strings.HasPrefix(m.Subject(), "$KV."+bucket+".e.") {
			return // not an entry (the trust record)
		}
		var rec schedule.Record
		if err := json.Unmarshal(m.Data(), &rec); err != nil || rec.Pod == "" {
			b.Fatalf("bucket %s entry %s: %v", bucket, m.Subject(), err)
		}
		if _, seen := out[rec.Pod]; !seen {
			out[rec.Pod] = at
		}
	})
	return out
}

// readStream hands every message of stream (filtered by subject, "" for all) to
// f with its stored time.
func readStream(b *testing.B, js jetstream.JetStream, stream, subject string, f func(jetstream.Msg, time.Time)) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := jetstream.OrderedConsumerConfig{}
	if subject != "" {
		cfg.FilterSubjects = []string{subject}
	}
	c, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		b.Fatalf("read %s: %v", stream, err)
	}
	for {
		batch, err := c.FetchNoWait(1000)
		if err != nil {
			b.Fatalf("read %s: %v", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				b.Fatal(err)
			}
			f(m, md.Timestamp)
			got++
		}
		if batch.Error() != nil {
			b.Fatalf("read %s: %v", stream, batch.Error())
		}
		if got == 0 {
			return
		}
	}
}

func span(ts map[string]time.Time) (first, last time.Time) {
	for _, t := range ts {
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	return first, last
}

// stepCosts times, per event, the steps of the rotator's handling of the stored
// cert.issued events, one at a time: envelope decode, chain parse and verify
// against the signer's bundle (as the rotator checks records), and a schedule
// bucket write.
func stepCosts(b *testing.B, nc *nats.Conn, js jetstream.JetStream, n int) (c struct{ decode, verify, write float64 }) {
	ctx := context.Background()
	var msgs []*nats.Msg
	readStream(b, js, events.StreamEvents, events.SubjectCertIssued, func(m jetstream.Msg, _ time.Time) {
		msgs = append(msgs, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	})
	evs := make([]events.CertIssued, len(msgs))
	start := time.Now()
	for i, m := range msgs {
		ev, _, err := events.Decode[events.CertIssued](m)
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = ev
	}
	c.decode = float64(time.Since(start).Microseconds()) / float64(len(msgs))

	reply, err := trustbundle.Fetch(ctx, nc, "rotator-bench")
	if err != nil {
		b.Fatal(err)
	}
	trust := trustbundle.New("", nil, nil)
	if _, _, err := trust.Accept(trustbundle.FromBundleReply(reply)); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	for _, ev := range evs {
		chain, err := pki.ParseCertPEMs(ev.CertChain)
		if err != nil {
			b.Fatal(err)
		}
		if err := trust.VerifyChain(chain, nil, chain[0].NotBefore); err != nil {
			b.Fatalf("chain of %s: %v", ev.Pod, err)
		}
	}
	c.verify = float64(time.Since(start).Microseconds()) / float64(len(evs))

	st, err := store.Open(ctx, js, "bench_steps", 1, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	for _, ev := range evs {
		rec := schedule.Record{Pod: ev.Pod.String(), Resource: "default", Serial: ev.Serial, Root: ev.RootFingerprint,
			NotBefore: ev.NotBefore.UnixNano(), NotAfter: ev.NotAfter.UnixNano()}
		if _, err := st.Write(ctx, rec); err != nil {
			b.Fatal(err)
		}
	}
	c.write = float64(time.Since(start).Microseconds()) / float64(len(evs))
	if len(evs) != n {
		b.Fatalf("%d events in the stream, want %d", len(evs), n)
	}
	return c
}
