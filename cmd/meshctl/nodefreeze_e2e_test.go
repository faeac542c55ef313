package main

import (
	"context"
	"crypto/x509"
	"net/http"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A frozen node agent (SIGSTOP: no exit, no closed socket, as a node under
// memory pressure or a paused VM looks) costs only its own node's pods: the
// other node's pod keeps renewing through it all, and once the agent resumes,
// its pod renews too, having never served an expired certificate; the hub holds
// both nodes again.
func TestFrozenNodeAgentCostsOnlyItsOwnNode(t *testing.T) {
	needNodeAgent(t)
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 2, Nodes: 2, LeafTTL: time.Minute, OneProcessPods: true})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pods) != 2 || st.Pods[0].Node != "node-0" || st.Pods[1].Node != "node-1" {
		t.Fatalf("pods %+v, want one on node-0 and one on node-1", st.Pods)
	}
	frozenPod, livePod := st.Pods[0], st.Pods[1]
	pid := 0
	for _, p := range st.Processes {
		if p.Name == "node-0" {
			pid = p.PID
		}
	}
	if pid == 0 {
		t.Fatal("stack.json lists no node-0 process")
	}
	served := func(pod stackfile.Pod) *x509.Certificate {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cc, err := sdsclient.DialUnix(ctx, pod.SDSSocket)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		secrets, err := sdsclient.Fetch(ctx, cc, "sidecar~freeze", "default")
		if err != nil {
			t.Fatalf("pod %s: %v", pod.ID, err)
		}
		leaf := verifyLeaf(t, secrets["default"], st.TrustBundle)
		if now := time.Now(); now.After(leaf.NotAfter) {
			t.Fatalf("pod %s serves a certificate that expired at %s", pod.ID, leaf.NotAfter)
		}
		return leaf
	}
	frozenBefore, liveBefore := served(frozenPod), served(livePod)

	resume := freeze(t, pid)
	// Positive control: the freeze took. The agent answers nothing.
	client := &http.Client{Timeout: time.Second}
	if resp, err := client.Get("http://" + st.Nodes[0].HTTP + "/readyz"); err == nil {
		resp.Body.Close()
		t.Fatalf("node-0's agent answered /readyz (%s) while stopped", resp.Status)
	}
	testkit.EventuallyWithin(t, 90*time.Second, "the other node's pod renews while node-0 is frozen", func() bool {
		_ = served(frozenPod) // and the frozen node's pod still serves a live certificate
		return served(livePod).SerialNumber.Cmp(liveBefore.SerialNumber) != 0
	})
	resume()
	testkit.EventuallyWithin(t, 90*time.Second, "node-0's pod renews once its agent resumes", func() bool {
		return served(frozenPod).SerialNumber.Cmp(frozenBefore.SerialNumber) != 0
	})
	var v struct{ Leafnodes int }
	testkit.Eventually(t, "the hub holds both nodes", func() bool {
		getJSON(t, st.NATSMonitor+"/varz", &v)
		return v.Leafnodes == 2
	})
}
