package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/loadgen"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
)

// stackConns are the hub connections of `meshctl up -pods 0` itself: meshctl's
// own (admin), the signer's two (its service connection and its auth
// callout's), the rotator's and the operator's.
const stackConns = 5

// needNodeAgent skips a test of the node tier when the node-agent binary is
// not there to run.
func needNodeAgent(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(binDir, "node-agent")); err != nil {
		t.Skipf("no node-agent binary in %s: %v", binDir, err)
	}
}

// meshctl bench storm -nodes against a local stack: 200 pods, each with its
// own key and pod- and node-bound token, spread over 4 real node agents that
// the storm starts against the hub's leaf listener. Every pod is certified
// through its node, nothing is wasted, the hub holds one connection per node
// beside the stack's own and its callout admits no pod: the node agents admit
// them, one admission each. A second storm on the same stack, its pods in
// worker processes (each taking whole nodes), certifies every pod again.
func TestBenchStormThroughTheNodeTier(t *testing.T) {
	needNodeAgent(t)
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	for _, tc := range []struct {
		name    string
		workers int
		args    []string
	}{
		{"in meshctl", 1, nil},
		{"in workers", 4, []string{"-pods-per-worker", "60"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"bench", "storm", "-dir", dir, "-pods", "200", "-nodes", "4", "-bin-dir", binDir, "-timeout", "25s", "-o", "json"}, tc.args...)
			out, err := meshctl(t, args...)
			if err != nil {
				t.Fatalf("bench storm -nodes 4: %v\n%s", err, out)
			}
			var r loadgen.StormResult
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("bench storm -o json: %v\n%s", err, out)
			}
			if r.Pods != 200 || r.Nodes != 4 || r.Workers != tc.workers || r.Certified != 200 || r.Failed != 0 || len(r.Unread) != 0 {
				t.Fatalf("bench storm -nodes 4: %+v", r)
			}
			if r.Wasted != 0 || r.WastedUnknown || r.NodeAdmitted != 200 || r.Admitted != 0 {
				t.Fatalf("wasted %d (unknown %v); node agents admitted %v of 200 pods, the hub's callout %v: %+v", r.Wasted, r.WastedUnknown, r.NodeAdmitted, r.Admitted, r)
			}
			if r.HubConns != 4+stackConns || r.HubConnsBefore != 4+stackConns || r.HubConnsEnd != 4+stackConns {
				t.Fatalf("hub connections %d at the peak (%d before, %d at the end), want %d: the 4 nodes and the stack's %d",
					r.HubConns, r.HubConnsBefore, r.HubConnsEnd, 4+stackConns, stackConns)
			}
			if r.NodesCPUMicroPerPod <= 0 || r.SignerCPUMicroPerPod <= 0 || r.ClientCPUMicroPerPod <= 0 {
				t.Fatalf("CPU not read: %+v", r)
			}
		})
	}
}

// meshctl up -nodes 2: two node agents, each a leaf node of the hub, and the
// demo pods spread over them, each reaching the bus through its own node and
// holding its certificate; the hub holds the two nodes' connections and none
// of the pods'.
func TestUpNodesDemoPodsHoldCertificates(t *testing.T) {
	needNodeAgent(t)
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 2, Nodes: 2, LeafTTL: time.Hour, OneProcessPods: true})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 2 || st.Nodes[0].Name != "node-0" || st.Nodes[1].Name != "node-1" || st.LeafURL == "" || st.NATSMonitor == "" {
		t.Fatalf("stack.json nodes %+v, leaf %q, monitor %q", st.Nodes, st.LeafURL, st.NATSMonitor)
	}
	var names []string
	for _, p := range st.Processes {
		names = append(names, p.Name)
	}
	for _, want := range []string{"node-0", "node-1"} {
		if !slices.Contains(names, want) {
			t.Fatalf("processes %v: no %s", names, want)
		}
	}
	for i, pod := range st.Pods {
		if want := fmt.Sprintf("node-%d", i); pod.Node != want {
			t.Fatalf("pod %s on node %q, want %s", pod.ID, pod.Node, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cc, err := sdsclient.DialUnix(ctx, pod.SDSSocket)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		secrets, err := sdsclient.Fetch(ctx, cc, "sidecar~nodes", "default")
		cc.Close()
		cancel()
		if err != nil {
			t.Fatalf("pod %s: %v", pod.ID, err)
		}
		if leaf := verifyLeaf(t, secrets["default"], st.TrustBundle); leaf.URIs[0].String() != pod.SPIFFEID {
			t.Fatalf("pod %s: identity %v, want %s", pod.ID, leaf.URIs, pod.SPIFFEID)
		}
	}
	// Each node agent admitted its one pod; the hub holds the stack's
	// connections and the two nodes', none of the pods'.
	for _, n := range st.Nodes {
		testkit.Eventually(t, n.Name+" admitted its pod", func() bool {
			return metric(t, n.HTTP, "meshagent_node_admissions_total") >= 1
		})
	}
	var v struct{ Connections, Leafnodes int }
	getJSON(t, st.NATSMonitor+"/varz", &v)
	if v.Leafnodes != 2 || v.Connections != stackConns {
		t.Fatalf("hub: %d client and %d leaf connections, want %d and 2", v.Connections, v.Leafnodes, stackConns)
	}
}

func getJSON(t *testing.T, url string, into any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}
