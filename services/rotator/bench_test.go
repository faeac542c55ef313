package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/services/rotator/internal/store"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go/jetstream"
)

var benchT0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func benchCert(rng *rand.Rand, i int, life time.Duration, root string) schedule.Cert {
	var serial [16]byte
	for j := range serial {
		serial[j] = byte(rng.Uint32())
	}
	age := time.Duration(rng.Int64N(int64(life) * 49 / 100))
	nb := benchT0.Add(-age)
	return schedule.Cert{Pod: "pod-" + strconv.Itoa(i), Serial: hex.EncodeToString(serial[:]), Root: root,
		NotBefore: nb, NotAfter: nb.Add(life)}
}

// rssBytes is the process's resident set after a full GC with freed memory
// returned to the OS.
func rssBytes() (rss, live uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	live = s[0].Value.Uint64()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, live
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, live
		}
	}
	return 0, live
}

// BenchmarkSchedule1M inserts 1,000,000 certificates (24h, random age, one pod
// each) and reports the insert rate and the memory the schedule holds.
func BenchmarkSchedule1M(b *testing.B) {
	n := envInt("ROTATOR_BENCH_ENTRIES", 1_000_000)
	for range b.N {
		rng := rand.New(rand.NewPCG(1, 2))
		rss0, live0 := rssBytes()
		s := schedule.New(schedule.Config{GraceRatio: 0.5, Jitter: 0.01, RetryAfter: 30 * time.Second, RetryMax: 5 * time.Minute, Rate: 500, Burst: 50})
		start := time.Now()
		for i := range n {
			if _, err := s.Upsert(benchCert(rng, i, 24*time.Hour, "root-a"), benchT0); err != nil {
				b.Fatal(err)
			}
		}
		took := time.Since(start)
		rss, live := rssBytes()
		b.ReportMetric(float64(n)/took.Seconds(), "inserts/s")
		b.ReportMetric(float64(rss)/(1<<20), "rss-MB")
		b.ReportMetric(float64(rss-rss0)/(1<<20), "rss-delta-MB")
		b.ReportMetric(float64(live-live0)/float64(n), "heap-B/entry")
		// Touch the schedule so it is live at the measurement, and time one pass.
		start = time.Now()
		st := s.Stats()
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "stats-scan-ms")
		if st.Scheduled != n {
			b.Fatalf("scheduled %d of %d", st.Scheduled, n)
		}
		b.Logf("%d entries: %.0f inserts/s (%v), rss %.0f MB (+%.0f MB), live heap %.0f MB",
			n, float64(n)/took.Seconds(), took.Round(time.Millisecond), float64(rss)/(1<<20), float64(rss-rss0)/(1<<20), float64(live-live0)/(1<<20))
	}
}

// BenchmarkRebuild writes ROTATOR_BENCH_REBUILD entries (default 200,000) to the
// schedule bucket on an embedded JetStream server and times a restart's rebuild:
// read every record back (a KV watch) and restore it into a fresh schedule.
func BenchmarkRebuild(b *testing.B) {
	n := envInt("ROTATOR_BENCH_REBUILD", 200_000)
	for range b.N {
		srv := bustest.Server(b)
		nc := bustest.Conn(b, srv)
		js := bustest.JetStream(b, nc)
		ctx := context.Background()
		st, err := store.Open(ctx, js, "bench_rotator", 1, hclog.NewNullLogger())
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		fillBucket(b, js, "bench_rotator", n)
		write := time.Since(start)

		s := schedule.New(schedule.Config{GraceRatio: 0.5, Jitter: 0.01, RetryAfter: 30 * time.Second, RetryMax: 5 * time.Minute, Rate: 500, Burst: 50})
		start = time.Now()
		got, _, err := st.Load(ctx, s, clock.NewFake(benchT0))
		took := time.Since(start)
		if err != nil || got != n || s.Len() != n {
			b.Fatalf("rebuilt %d of %d: %v", got, n, err)
		}
		per := took / time.Duration(n)
		b.ReportMetric(took.Seconds(), "rebuild-s")
		b.ReportMetric(float64(per.Nanoseconds())/1000, "us/entry")
		b.ReportMetric((per * 1_000_000).Seconds(), "rebuild-1M-extrapolated-s")
		b.Logf("wrote %d records in %v; rebuilt in %v (%v/entry, 1M extrapolated %v)", n, write.Round(time.Millisecond),
			took.Round(time.Millisecond), per, (per * 1_000_000).Round(100*time.Millisecond))
	}
}

// fillBucket writes n schedule records straight to the bucket's stream.
func fillBucket(b *testing.B, js jetstream.JetStream, bucket string, n int) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range n {
		c := benchCert(rng, i, 24*time.Hour, "root-a")
		rec := schedule.Record{Pod: c.Pod, Resource: "default", Serial: c.Serial, Root: c.Root,
			NotBefore: c.NotBefore.UnixNano(), NotAfter: c.NotAfter.UnixNano()}
		data, _ := json.Marshal(rec)
		key, err := store.Key(c.Pod, "default")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync("$KV."+bucket+"."+key, data); err != nil {
			b.Fatal(err)
		}
		if i%2_000 == 1_999 { // stay under the client's async window
			<-js.PublishAsyncComplete()
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("async publish did not complete")
	}
}
