package loadgen

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/tests/testkit"
)

// fakeStack serves a signer's /metrics (its counters at admitted, then, from
// the failAfter-th read on, 500) and a hub's /varz.
func fakeStack(t *testing.T, admitted *atomic.Int64, failAfter int64) *stackfile.Stack {
	t.Helper()
	var reads atomic.Int64
	signer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if reads.Add(1) > failAfter {
			http.Error(w, "gone", http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "process_cpu_seconds_total 1\nmeshagent_signer_bus_callout_admitted_total %d\nmeshagent_signer_certs_issued_total %d\n", admitted.Load(), admitted.Load())
	}))
	t.Cleanup(signer.Close)
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"connections": 6, "leafnodes": 2}`)
	}))
	t.Cleanup(hub.Close)
	return &stackfile.Stack{Signer: stackfile.Signer{Service: stackfile.Service{HTTP: strings.TrimPrefix(signer.URL, "http://")}}, NATSMonitor: hub.URL}
}

// A storm whose signer metrics cannot be read after it says so: wasted is
// unknown, and the result is an error — never a wasted=0 taken from nothing.
func TestMeterWastedUnknownWhenSignerMetricsUnread(t *testing.T) {
	var admitted atomic.Int64
	cfg := StormConfig{Stack: fakeStack(t, &admitted, 1), NATSPID: os.Getpid()}
	m := startMeter(cfg, nil, []int{os.Getpid()})
	admitted.Store(5)
	res := StormResult{Pods: 3, Certified: 3}
	m.finish(&res, 3)
	if !res.WastedUnknown || res.Err() == nil || !strings.Contains(res.Err().Error(), "signer metrics") {
		t.Fatalf("signer metrics unread, result %+v, error %v", res, res.Err())
	}
}

// Read, the figures come from how the counters grew: admissions beyond the
// connections held and certificates beyond the pods certified are wasted, and
// the hub's connections are its clients and leaf nodes.
func TestMeterCountsWaste(t *testing.T) {
	var admitted atomic.Int64
	admitted.Store(10)
	cfg := StormConfig{Stack: fakeStack(t, &admitted, 1<<30), NATSPID: os.Getpid()}
	m := startMeter(cfg, nil, []int{os.Getpid()})
	admitted.Store(15)
	res := StormResult{Pods: 3, Certified: 3}
	m.finish(&res, 3)
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if res.WastedUnknown || res.WastedAdmissions != 2 || res.WastedCerts != 2 || res.Wasted != 4 {
		t.Fatalf("waste %+v", res)
	}
	if res.HubConns != 8 || res.HubConnsBefore != 8 || res.HubConnsEnd != 8 {
		t.Fatalf("hub connections %+v", res)
	}
}

// A hub whose monitoring cannot be read is named, not counted as no connections.
func TestMeterHubUnread(t *testing.T) {
	var admitted atomic.Int64
	st := fakeStack(t, &admitted, 1<<30)
	st.NATSMonitor = ""
	m := startMeter(StormConfig{Stack: st, NATSPID: os.Getpid()}, nil, []int{os.Getpid()})
	res := StormResult{Pods: 1, Certified: 1}
	m.finish(&res, 1)
	if res.Err() == nil || !strings.Contains(res.Err().Error(), "hub connections") {
		t.Fatalf("hub unread, error %v", res.Err())
	}
}

// A worker takes whole nodes: every pod of a node is in one worker's job, and
// every pod in exactly one.
func TestJobOwnsWholeNodes(t *testing.T) {
	for _, l := range []Layout{{Pods: 1000, Nodes: 7}, {Pods: 1000}} {
		const workers = 3
		nodeWorker := map[int]int{}
		for i := range l.Pods {
			owners := 0
			for w := range workers {
				if (job{Layout: l, Worker: w, Workers: workers}).owns(i) {
					owners++
					if l.Nodes > 0 {
						if prev, ok := nodeWorker[i%l.Nodes]; ok && prev != w {
							t.Fatalf("node %d in workers %d and %d", i%l.Nodes, prev, w)
						}
						nodeWorker[i%l.Nodes] = w
					}
				}
			}
			if owners != 1 {
				t.Fatalf("%+v: pod %d owned by %d workers", l, i, owners)
			}
		}
	}
}

// A /varz sample that fails between the first and the last is counted as
// missed; the storm's figure stands on the samples read.
func TestHubSamplerCountsMissedSamples(t *testing.T) {
	var reads atomic.Int64
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := reads.Add(1); n == 2 || n == 3 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"connections": %d, "leafnodes": 1}`, reads.Load())
	}))
	t.Cleanup(hub.Close)
	h := sampleHub(hub.URL)
	testkit.Eventually(t, "five samples", func() bool { return reads.Load() >= 5 })
	peak, before, end, samples, missed, err := h.stop()
	if err != nil || missed != 2 || samples < 6 || before != 2 || end < 7 || peak != end {
		t.Fatalf("peak %d before %d end %d samples %d missed %d: %v", peak, before, end, samples, missed, err)
	}
}
