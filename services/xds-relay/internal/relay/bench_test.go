package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// Benchmarks compare the relay binary (a process of its own, as in a pod) with a
// direct connection to the same upstream in the same run; each does its whole
// measurement in one iteration (make bench runs -benchtime 1x) and reports
// ratios and medians, as the machine is noisy. The binary comes from
// MESHAGENT_BIN (make bench), else is built.

func benchClient(b *testing.B, target string) discoveryv3.AggregatedDiscoveryServiceClient {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
}

// relayBinary is the real xds-relay binary relaying to up, with an embedded bus
// holding the event stream (its events are published as in a pod).
type relayBinary struct {
	svc    *testkit.Service
	socket string
}

func startRelayBinary(b *testing.B, up *upstreamServer) *relayBinary {
	ns := bustest.Server(b)
	if _, err := bus.EnsureEventStream(context.Background(), bustest.JetStream(b, bustest.Conn(b, ns)), 1, time.Hour); err != nil {
		b.Fatal(err)
	}
	dir := testkit.ShortDir(b)
	svc := testkit.StartService(b, "xds-relay", []string{"-pod", "bench-0", "-pod-root", dir,
		"-discovery-address", up.addr, "-xds-tls", "plaintext", "-nats-url", ns.ClientURL(), "-log-level", "warn"})
	return &relayBinary{svc: svc, socket: filepath.Join(dir, "etc/istio/proxy/XDS")}
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

// BenchmarkThroughput: streams SotW streams, each ACKing every response and
// asking for the next version, against the relay binary and directly, rounds
// times alternating. ratio is relayed ÷ direct responses per second (wall);
// cpu-ratio is the CPU per response direct (this process: the clients and the
// go-control-plane server) over the same relayed (this process plus the relay's)
// — the figure the wall ratio tends to when the cores are busy, and the one that
// stays put on a shared machine.
func BenchmarkThroughput(b *testing.B) {
	up := startUpstream(b)
	up.noRecord.Store(true)
	rb := startRelayBinary(b, up)
	direct := benchClient(b, up.addr)
	relayed := benchClient(b, "unix://"+rb.socket)
	for _, tc := range []struct {
		streams, resources int
	}{{16, 1}, {16, 100}, {4, 1000}} {
		b.Run(fmt.Sprintf("streams=%d/resources=%d", tc.streams, tc.resources), func(b *testing.B) {
			const rounds, window = 6, time.Second
			var dRate, rRate, dMB, rMB, dCPU, rCPU, relayCPU []float64
			measure := func(client discoveryv3.AggregatedDiscoveryServiceClient, tag string, rate, mb, cpu *[]float64) {
				self0, relay0 := procCPU(b, os.Getpid()), rb.svc.CPU(b)
				n, by := pump(b, up, client, tag, tc.streams, tc.resources, window)
				self, relay := procCPU(b, os.Getpid())-self0, rb.svc.CPU(b)-relay0
				*rate = append(*rate, float64(n)/window.Seconds())
				*mb = append(*mb, float64(by)/window.Seconds()/1e6)
				if client == relayed {
					relayCPU = append(relayCPU, float64(relay.Microseconds())/float64(n))
					self += relay
				}
				*cpu = append(*cpu, float64(self.Microseconds())/float64(n))
				time.Sleep(300 * time.Millisecond) // let the streams wind down
			}
			for i := 0; i < b.N; i++ {
				for r := range rounds { // alternate the order, so that drift hits both sides
					if r%2 == 0 {
						measure(direct, fmt.Sprintf("d%d", r), &dRate, &dMB, &dCPU)
						measure(relayed, fmt.Sprintf("r%d", r), &rRate, &rMB, &rCPU)
					} else {
						measure(relayed, fmt.Sprintf("r%d", r), &rRate, &rMB, &rCPU)
						measure(direct, fmt.Sprintf("d%d", r), &dRate, &dMB, &dCPU)
					}
				}
			}
			ratio, cpuRatio := median(rRate)/median(dRate), median(dCPU)/median(rCPU)
			b.ReportMetric(median(dRate), "direct-resp/s")
			b.ReportMetric(median(rRate), "relayed-resp/s")
			b.ReportMetric(median(dMB), "direct-MB/s")
			b.ReportMetric(median(rMB), "relayed-MB/s")
			b.ReportMetric(ratio, "ratio")
			b.ReportMetric(median(dCPU), "direct-cpu-µs/resp")
			b.ReportMetric(median(rCPU), "relayed-cpu-µs/resp")
			b.ReportMetric(median(relayCPU), "relay-cpu-µs/resp")
			b.ReportMetric(cpuRatio, "cpu-ratio")
			b.Logf("direct %.0f resp/s %.1f MB/s, %.0f µs CPU/resp; relayed %.0f resp/s %.1f MB/s, %.0f µs CPU/resp of which the relay %.0f; ratio %.2f, CPU ratio %.2f (target >= 0.9)",
				median(dRate), median(dMB), median(dCPU), median(rRate), median(rMB), median(rCPU), median(relayCPU), ratio, cpuRatio)
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

// BenchmarkAddedLatency: the time from a new snapshot to the client holding it,
// through the relay binary and directly, interleaved; p50 and p99 of 2,000 each.
// For diagnosis, the same through a relay running inside this process
// (in-process-*): the relay's own code path without the hops between processes.
func BenchmarkAddedLatency(b *testing.B) {
	const rounds, perRound = 4, 500
	up := startUpstream(b)
	rb := startRelayBinary(b, up)
	env := startRelay(b, upstream.Config{Address: up.addr}, nil)
	direct := benchClient(b, up.addr)
	relayed := benchClient(b, "unix://"+rb.socket)
	inProcess := benchClient(b, "unix://"+env.socket)
	var d, r, ip []float64
	for i := 0; i < b.N; i++ {
		for round := range rounds { // interleaved, so noise hits every side alike
			d = append(d, latencies(b, up, direct, fmt.Sprintf("d%d", round), perRound)...)
			r = append(r, latencies(b, up, relayed, fmt.Sprintf("r%d", round), perRound)...)
			ip = append(ip, latencies(b, up, inProcess, fmt.Sprintf("i%d", round), perRound)...)
		}
	}
	b.ReportMetric(pct(d, 0.5), "direct-p50-µs")
	b.ReportMetric(pct(r, 0.5), "relayed-p50-µs")
	b.ReportMetric(pct(r, 0.5)-pct(d, 0.5), "added-p50-µs")
	b.ReportMetric(pct(r, 0.99)-pct(d, 0.99), "added-p99-µs")
	b.ReportMetric(pct(ip, 0.5)-pct(d, 0.5), "in-process-added-p50-µs")
	b.ReportMetric(pct(ip, 0.99)-pct(d, 0.99), "in-process-added-p99-µs")
	b.Logf("n=%d each: p50 direct %.0f µs, relayed %.0f µs (added %.0f, target <= 100), in-process relay %.0f µs (added %.0f); p99 direct %.0f, relayed %.0f (added %.0f), in-process %.0f (added %.0f)",
		len(d), pct(d, 0.5), pct(r, 0.5), pct(r, 0.5)-pct(d, 0.5), pct(ip, 0.5), pct(ip, 0.5)-pct(d, 0.5),
		pct(d, 0.99), pct(r, 0.99), pct(r, 0.99)-pct(d, 0.99), pct(ip, 0.99), pct(ip, 0.99)-pct(d, 0.99))
}

func procCPU(b *testing.B, pid int) time.Duration {
	d, err := testkit.ProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

func rssMB(b *testing.B, pid int) float64 {
	kb, err := testkit.ProcStatusKB(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	return kb / 1024
}

// BenchmarkRSS reads the relay binary's resident memory idle (against an
// in-process upstream and an embedded bus) and with 100 live streams.
func BenchmarkRSS(b *testing.B) {
	up := startUpstream(b)
	up.setClusters("rss", "1", clusterNamesN(10)...)
	for i := 0; i < b.N; i++ {
		rb := startRelayBinary(b, up)
		pid := rb.svc.Pid()
		testkit.Idle(context.Background(), 500*time.Millisecond) // settle after start-up
		idle := rssMB(b, pid)
		client := benchClient(b, "unix://"+rb.socket)
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
		testkit.Idle(ctx, 300*time.Millisecond) // the streams settled
		busy := rssMB(b, pid)
		cancel()
		b.ReportMetric(idle, "idle-RSS-MB")
		b.ReportMetric(busy, "100-streams-RSS-MB")
		b.ReportMetric((busy-idle)*1024/100, "KB/stream")
		b.Logf("RSS idle %.1f MB, with 100 streams %.1f MB (%.0f KB per stream)", idle, busy, (busy-idle)*1024/100)
	}
}
