package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/cli"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/testkit"
)

// meshctl bench storm against a local stack's real signer: 30 pods of three
// connections each, every one admitted by the signer's auth callout exactly once
// (none wasted), every pod certified once, the signer's CPU read.
func TestBenchStormCertifiesEveryPod(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	out, err := meshctl(t, "bench", "storm", "-dir", dir, "-pods", "30", "-conns", "3", "-timeout", "25s", "-o", "json")
	if err != nil {
		t.Fatalf("bench storm: %v\n%s", err, out)
	}
	var r cli.StormBench
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("bench storm -o json: %v\n%s", err, out)
	}
	if r.Pods != 30 || r.Certified != 30 || r.Failed != 0 || r.Seconds <= 0 {
		t.Fatalf("bench storm: %+v", r)
	}
	if r.Admitted != 90 || r.Wasted != 0 {
		t.Fatalf("admitted %v connections for 90, wasted %d: %+v", r.Admitted, r.Wasted, r)
	}
	if r.SignerCPUMicroPerPod <= 0 {
		t.Fatalf("signer CPU not read: %+v", r)
	}
	if out, err := meshctl(t, "bench", "storm", "-dir", dir, "-pods", "0"); err == nil {
		t.Fatalf("bench storm -pods 0 accepted:\n%s", out)
	}
}
