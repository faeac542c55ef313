package relay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/testkit"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// Benchmarks compare the relay with a direct connection to the same upstream in
// the same run; each does its whole measurement in one iteration (make bench runs
// -benchtime 1x) and reports ratios and medians, as the machine is noisy.

func benchClient(b *testing.B, target string) discoveryv3.AggregatedDiscoveryServiceClient {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
}

func clusterNamesN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("cluster-%04d", i)
	}
	return out
}

// pump runs streams concurrent SotW streams for d: each ACKs every response and
// then publishes the next version for its node, so the upstream always has one
// response in flight per stream. It returns responses and bytes received.
func pump(b *testing.B, up *upstreamServer, client discoveryv3.AggregatedDiscoveryServiceClient, tag string, streams, resources int, d time.Duration) (int64, int64) {
	names := clusterNamesN(resources)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var count, bytes atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range streams {
		id := fmt.Sprintf("%s-%d", tag, i)
		up.setClusters(id, "0", names...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := client.StreamAggregatedResources(ctx)
			if err != nil {
				return
			}
			if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(id), TypeUrl: resource.ClusterType}); err != nil {
				return
			}
			w, err := st.Recv() // warm-up response, not counted
			if err != nil {
				return
			}
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: w.GetVersionInfo(), ResponseNonce: w.GetNonce()}); err != nil {
				return
			}
			<-start
			for v := 1; ; v++ {
				up.setClusters(id, strconv.Itoa(v), names...)
				r, err := st.Recv()
				if err != nil {
					return
				}
				count.Add(1)
				bytes.Add(int64(proto.Size(r)))
				if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // let every stream take its warm-up response
	count.Store(0)
	bytes.Store(0)
	close(start)
	time.Sleep(d)
	c, by := count.Load(), bytes.Load()
	cancel()
	wg.Wait()
	return c, by
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func BenchmarkThroughput(b *testing.B) {
	for _, tc := range []struct {
		streams, resources int
	}{{16, 1}, {16, 100}, {4, 1000}} {
		b.Run(fmt.Sprintf("streams=%d/resources=%d", tc.streams, tc.resources), func(b *testing.B) {
			up := startUpstream(b)
			up.noRecord.Store(true)
			env := startRelay(b, upstream.Config{Address: up.addr}, nil)
			direct := benchClient(b, up.addr)
			relayed := benchClient(b, "unix://"+env.socket)
			const rounds, window = 4, time.Second
			var dRate, rRate, dMB, rMB []float64
			measure := func(client discoveryv3.AggregatedDiscoveryServiceClient, tag string, rate, mb *[]float64) {
				n, by := pump(b, up, client, tag, tc.streams, tc.resources, window)
				*rate = append(*rate, float64(n)/window.Seconds())
				*mb = append(*mb, float64(by)/window.Seconds()/1e6)
				time.Sleep(300 * time.Millisecond) // let the streams wind down
			}
			for i := 0; i < b.N; i++ {
				for r := range rounds { // alternate the order, so that drift hits both sides
					if r%2 == 0 {
						measure(direct, fmt.Sprintf("d%d", r), &dRate, &dMB)
						measure(relayed, fmt.Sprintf("r%d", r), &rRate, &rMB)
					} else {
						measure(relayed, fmt.Sprintf("r%d", r), &rRate, &rMB)
						measure(direct, fmt.Sprintf("d%d", r), &dRate, &dMB)
					}
				}
			}
			b.ReportMetric(median(dRate), "direct-resp/s")
			b.ReportMetric(median(rRate), "relayed-resp/s")
			b.ReportMetric(median(dMB), "direct-MB/s")
			b.ReportMetric(median(rMB), "relayed-MB/s")
			b.ReportMetric(median(rRate)/median(dRate), "ratio")
			b.Logf("direct %.0f resp/s %.1f MB/s; relayed %.0f resp/s %.1f MB/s; ratio %.2f (target >= 0.9)",
				median(dRate), median(dMB), median(rRate), median(rMB), median(rRate)/median(dRate))
		})
	}
}

// latencies measures, n times, the time from publishing a new snapshot to the
// client receiving it (the client ACKs in between, outside the timed part).
func latencies(b *testing.B, up *upstreamServer, client discoveryv3.AggregatedDiscoveryServiceClient, id string, n int) []float64 {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up.setClusters(id, "0", "a")
	st, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(id), TypeUrl: resource.ClusterType}); err != nil {
		b.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		b.Fatal(err)
	}
	out := make([]float64, 0, n)
	for v := 1; v <= n; v++ {
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
			b.Fatal(err)
		}
		// Let the ACK land and the upstream re-arm its watch.
		for len(up.seen(func(q *discoveryv3.DiscoveryRequest) bool {
			return q.GetResponseNonce() == r.GetNonce() && q.GetNode().GetId() == id
		})) == 0 {
			time.Sleep(20 * time.Microsecond)
		}
		time.Sleep(200 * time.Microsecond)
		t0 := time.Now()
		up.setClusters(id, strconv.Itoa(v), "a")
		if r, err = st.Recv(); err != nil {
			b.Fatal(err)
		}
		out = append(out, float64(time.Since(t0).Microseconds()))
	}
	return out
}

func pct(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}

func BenchmarkAddedLatency(b *testing.B) {
	up := startUpstream(b)
	env := startRelay(b, upstream.Config{Address: up.addr}, nil)
	direct := benchClient(b, up.addr)
	relayed := benchClient(b, "unix://"+env.socket)
	var d, r []float64
	for i := 0; i < b.N; i++ {
		for round := range 4 { // interleaved, so noise hits both sides alike
			d = append(d, latencies(b, up, direct, fmt.Sprintf("d%d", round), 150)...)
			r = append(r, latencies(b, up, relayed, fmt.Sprintf("r%d", round), 150)...)
		}
	}
	b.ReportMetric(pct(d, 0.5), "direct-p50-µs")
	b.ReportMetric(pct(r, 0.5), "relayed-p50-µs")
	b.ReportMetric(pct(r, 0.5)-pct(d, 0.5), "added-p50-µs")
	b.ReportMetric(pct(r, 0.99)-pct(d, 0.99), "added-p99-µs")
	b.Logf("p50 direct %.0f µs relayed %.0f µs (added %.0f, target <= 100); p99 direct %.0f relayed %.0f (added %.0f)",
		pct(d, 0.5), pct(r, 0.5), pct(r, 0.5)-pct(d, 0.5), pct(d, 0.99), pct(r, 0.99), pct(r, 0.99)-pct(d, 0.99))
}

func rssKB(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// cpuSeconds is the process's user+system CPU time from /proc/<pid>/stat.
func cpuSeconds(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the ")" that closes the command name; utime and stime are 14 and 15.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// BenchmarkRSS builds the real binary, runs it against an in-process upstream and
// an embedded bus, and reads its resident memory idle and with 100 live streams.
func BenchmarkRSS(b *testing.B) {
	dir := testkit.ShortDir(b)
	bin := filepath.Join(dir, "xds-relay")
	build := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", bin, "../..") // as make build
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	ns := bustest.Server(b)
	up := startUpstream(b)
	up.setClusters("rss", "1", clusterNamesN(10)...)
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(bin, "-pod", "rss-0", "-pod-root", dir, "-discovery-address", up.addr, "-xds-tls", "plaintext",
			"-nats-url", ns.ClientURL(), "-http-addr", "127.0.0.1:0", "-log-level", "warn")
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		socket := filepath.Join(dir, "etc/istio/proxy/XDS")
		testkit.Eventually(b, "relay socket", func() bool { _, err := os.Stat(socket); return err == nil })
		time.Sleep(500 * time.Millisecond)
		idle := rssKB(b, cmd.Process.Pid)
		client := benchClient(b, "unix://"+socket)
		ctx, cancel := context.WithCancel(context.Background())
		for range 100 {
			st, err := client.StreamAggregatedResources(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node("rss"), TypeUrl: resource.ClusterType}); err != nil {
				b.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(300 * time.Millisecond)
		busy := rssKB(b, cmd.Process.Pid)
		cancel()
		// The relay process's own CPU per relayed response (and its ACK), small configs.
		up.noRecord.Store(true)
		cpu0 := cpuSeconds(b, cmd.Process.Pid)
		n, _ := pump(b, up, client, "cpu", 8, 1, 2*time.Second)
		perResp := (cpuSeconds(b, cmd.Process.Pid) - cpu0) / float64(n) * 1e6
		b.ReportMetric(idle/1024, "idle-RSS-MB")
		b.ReportMetric(busy/1024, "100-streams-RSS-MB")
		b.ReportMetric((busy-idle)/100, "KB/stream")
		b.ReportMetric(perResp, "relay-CPU-µs/resp")
		b.Logf("RSS idle %.1f MB, with 100 streams %.1f MB (%.0f KB per stream); relay CPU %.1f µs per response+ACK (%d responses)",
			idle/1024, busy/1024, (busy-idle)/100, perResp, n)
	}
}
