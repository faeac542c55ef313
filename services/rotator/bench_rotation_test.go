package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/rotator/internal/renewal"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
	"github.com/meshagent/meshagent/tests/bustest"
)

// BenchmarkRootRotation100k simulates a root rotation over 100,000 pods, each at a
// random point of the first 49% of its certificate's life, against a signer as
// fast as the real signer binary measured in the same run: meshctl bench sign
// (P-256, 32 in flight, pod-bound tokens verified per request) over a TCP
// nats-server. It runs the real schedule (rate limit, urgency order, retries) on
// simulated time and reports the time to finish and the smallest fraction of a
// lifetime left on any old certificate when its successor was issued.
func BenchmarkRootRotation100k(b *testing.B) {
	pods := envInt("ROTATOR_BENCH_PODS", 100_000)
	st := startSignerStack(b, 3000)
	measured := st.benchSign(b, 3000)
	signer := measured.Rate
	b.Logf("real signer binary: %.0f CSRs/s (p50 %d µs, p99 %d µs, %.0f µs CPU per CSR), simulated as the fleet's signer",
		signer, measured.P50Micro, measured.P99Micro, measured.CPUMicro)
	cases := []struct {
		life time.Duration
		rate float64
	}{
		{24 * time.Hour, 500},
		{time.Hour, 500},
		{time.Hour, signer}, // renewals as fast as the signer signs
		{10 * time.Minute, 500},
		{10 * time.Minute, 250}, // undersized on purpose: shows the limit, worst ≈ 1 - pods/(rate·life)
	}
	for _, tc := range cases {
		name := fmt.Sprintf("life=%v/rate=%.0f", tc.life, tc.rate)
		if tc.rate == signer {
			name = fmt.Sprintf("life=%v/rate=signer", tc.life)
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				res := simulateRotation(b, pods, tc.life, tc.rate, signer)
				b.ReportMetric(signer, "signer-CSRs/s")
				b.ReportMetric(tc.rate, "renew-rate/s")
				b.ReportMetric(res.finish.Seconds(), "finish-s")
				b.ReportMetric(res.minLeft, "min-life-left")
				b.ReportMetric(float64(res.expired), "expiries")
				b.ReportMetric(float64(res.retries), "retries")
				b.Logf("%d pods, life %v, renew rate %.0f/s, signer %.0f/s (measured): finished in %v, worst %.3f of lifetime left, %d expiries, %d retries",
					pods, tc.life, tc.rate, signer, res.finish.Round(time.Millisecond), res.minLeft, res.expired, res.retries)
			}
		})
	}
}

type rotationResult struct {
	finish           time.Duration
	minLeft          float64
	expired, retries int
}

func simulateRotation(b *testing.B, pods int, life time.Duration, rate, signerRate float64) rotationResult {
	rng := rand.New(rand.NewPCG(5, 6))
	s := schedule.New(schedule.Config{GraceRatio: 0.5, Jitter: 0.01, RetryAfter: 30 * time.Second,
		RetryMax: 5 * time.Minute, Rate: rate, Burst: 50})
	s.ChangeTrust("root-a", nil, 1, benchT0)
	for i := range pods {
		if _, err := s.Upsert(benchCert(rng, i, life, "root-a"), benchT0); err != nil {
			b.Fatal(err)
		}
	}
	if n, _ := s.ChangeTrust("root-b", []string{"root-a"}, 2, benchT0); n != pods {
		b.Fatalf("marked %d of %d", n, pods)
	}
	type job struct {
		at       time.Time
		pod      string
		notAfter time.Time
	}
	var queue []job // signer completions, in order
	signerFree := benchT0
	per := time.Duration(float64(time.Second) / signerRate)
	res := rotationResult{minLeft: 1}
	renewed := map[string]bool{}
	now := benchT0
	for len(renewed) < pods {
		// The signer finishes what it can by now: the pod gets a new certificate.
		for len(queue) > 0 && !queue[0].at.After(now) {
			j := queue[0]
			queue = queue[1:]
			if renewed[j.pod] {
				continue
			}
			renewed[j.pod] = true
			left := float64(j.notAfter.Sub(j.at)) / float64(life)
			res.minLeft = min(res.minLeft, left)
			if left <= 0 {
				res.expired++
			}
			res.finish = max(res.finish, j.at.Sub(benchT0))
			c := schedule.Cert{Pod: j.pod, Serial: "n-" + j.pod, Root: "root-b", NotBefore: j.at, NotAfter: j.at.Add(life)}
			if _, err := s.Upsert(c, j.at); err != nil {
				b.Fatal(err)
			}
		}
		for _, r := range s.Take(now, 1<<16) {
			if r.Reason == "retry" {
				res.retries++
			}
			if r.Retired {
				res.expired++
			}
			start := now
			if signerFree.After(start) {
				start = signerFree
			}
			signerFree = start.Add(per)
			queue = append(queue, job{at: signerFree, pod: r.Pod, notAfter: r.NotAfter})
		}
		next, ok := s.NextWake(now)
		if len(queue) > 0 && (!ok || queue[0].at.Before(next)) {
			next, ok = queue[0].at, true
		}
		if !ok {
			b.Fatalf("simulation stalled with %d of %d renewed", len(renewed), pods)
		}
		if next.After(now) {
			now = next
		}
	}
	return res
}

// BenchmarkFailover measures, on the wall clock and a real embedded NATS, how long
// a follower takes to lead after the leader crashes (cut off the bus), with the
// default lease TTL of 5 s (ROTATOR_BENCH_LEASE_TTL to change it).
func BenchmarkFailover(b *testing.B) {
	ttl := 5 * time.Second
	if d, err := time.ParseDuration(os.Getenv("ROTATOR_BENCH_LEASE_TTL")); err == nil && d > 0 {
		ttl = d
	}
	entries := envInt("ROTATOR_BENCH_FAILOVER_ENTRIES", 100_000)
	for range b.N {
		srv := bustest.Server(b)
		{
			nc := bustest.Conn(b, srv)
			js := bustest.JetStream(b, nc)
			if _, err := bus.EnsureEventStream(context.Background(), js, 1, time.Hour); err != nil {
				b.Fatal(err)
			}
			if _, err := store.Open(context.Background(), js, "bench_sched", 1, hclog.NewNullLogger()); err != nil {
				b.Fatal(err)
			}
			fillBucket(b, js, "bench_sched", entries)
		}
		start := func(name string) (*renewal.Replica, func(), func()) {
			nc := bustest.Conn(b, srv)
			opts := renewal.Options{
				Schedule: schedule.Config{GraceRatio: 0.5, RetryAfter: time.Minute, RetryMax: time.Hour, Rate: 500, Burst: 50},
				Instance: name, LeaseTTL: ttl, Consumer: "rotator", Bucket: "bench_sched", LeaseBucket: "bench_lease", Replicas: 1,
			}
			r, err := renewal.New(opts, lifecycle.Deps{Bus: nc}.WithDefaults())
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = r.Run(ctx) }()
			stop := func() { cancel(); <-done }
			b.Cleanup(stop)
			return r, stop, nc.Close
		}
		wait := func(what string, limit time.Duration, cond func() bool) time.Duration {
			t0 := time.Now()
			for !cond() {
				if time.Since(t0) > limit {
					b.Fatalf("%s: not after %v", what, limit)
				}
				time.Sleep(10 * time.Millisecond)
			}
			return time.Since(t0)
		}
		a, stopA, cutA := start("a")
		wait("a leads", time.Minute, func() bool { return a.Leader() && a.Ready() == nil })
		cold, _ := a.LastRebuild()
		f, stopF, _ := start("b")
		wait("b follows, standby warm", time.Minute, func() bool { return f.Ready() == nil && f.MirrorWarm() })
		time.Sleep(ttl / 2) // a few rounds of renewals
		cutA()
		crash := wait("b leads after a crash", 3*ttl, func() bool { return f.Leader() })
		ready := crash + wait("b ready", time.Minute, func() bool { return f.Ready() == nil })
		warm, changes := f.LastRebuild()
		stopA()
		b.ReportMetric(crash.Seconds(), "crash-failover-s")
		b.ReportMetric(ready.Seconds(), "crash-to-ready-s")
		b.ReportMetric(f.Lease().MaxFailover().Seconds(), "bound-s")
		b.ReportMetric(cold.Seconds(), "cold-rebuild-s")
		b.ReportMetric(warm.Seconds(), "warm-takeover-rebuild-s")
		b.Logf("%d entries: cold rebuild %v; warm standby takeover read %d changes in %v",
			entries, cold.Round(time.Millisecond), changes, warm.Round(time.Millisecond))

		// Clean hand-over: b stops and releases; a fresh replica takes over.
		c, _, _ := start("c")
		wait("c follows", 10*time.Second, func() bool { return c.Ready() == nil })
		t0 := time.Now()
		stopF()
		clean := time.Since(t0) + wait("c leads after b stops", 3*ttl, func() bool { return c.Leader() })
		b.ReportMetric(clean.Seconds(), "clean-handover-s")
		b.Logf("lease ttl %v: crash failover %v (bound %v), clean hand-over %v",
			ttl, crash.Round(time.Millisecond), f.Lease().MaxFailover(), clean.Round(time.Millisecond))
	}
}
