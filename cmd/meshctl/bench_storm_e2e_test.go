package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/loadgen"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/tests/testkit"
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
	var r loadgen.StormResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("bench storm -o json: %v\n%s", err, out)
	}
	if r.Pods != 30 || r.Certified != 30 || r.Failed != 0 || r.Seconds <= 0 {
		t.Fatalf("bench storm: %+v", r)
	}
	if r.Admitted != 90 || r.Wasted != 0 {
		t.Fatalf("admitted %v connections for 90, wasted %d: %+v", r.Admitted, r.Wasted, r)
	}
	if r.SignerCPUMicroPerPod <= 0 || r.NATSCPUMicroPerPod <= 0 || len(r.Unread) != 0 {
		t.Fatalf("CPU not read: %+v", r)
	}
	// Directly, the hub holds every pod's connections: at the end, while all
	// are held, 90 more than before.
	if r.HubConnsEnd != r.HubConnsBefore+90 || r.HubConns < r.HubConnsEnd {
		t.Fatalf("hub connections %d before, %d at the peak, %d at the end; want 90 more", r.HubConnsBefore, r.HubConns, r.HubConnsEnd)
	}
	if out, err := meshctl(t, "bench", "storm", "-dir", dir, "-pods", "0"); err == nil {
		t.Fatalf("bench storm -pods 0 accepted:\n%s", out)
	}
	if out, err := meshctl(t, "bench", "storm", "-dir", dir, "-pods", "1", "-rotate", "sideways"); err == nil || !strings.Contains(err.Error()+out, "-rotate") {
		t.Fatalf("bench storm -rotate sideways: %v\n%s", err, out)
	}
}

// meshctl bench storm -rotate: after the storm a new-key root rotation through the
// stack's real signer and rotator, each live pod renewing on the rotator's command
// until it holds a certificate of the new root generation.
func TestBenchStormRotatesLivePods(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	out, err := meshctl(t, "bench", "storm", "-dir", dir, "-pods", "20", "-conns", "1", "-timeout", "40s", "-rotate", "new-key", "-o", "json")
	if err != nil {
		t.Fatalf("bench storm -rotate: %v\n%s", err, out)
	}
	var r loadgen.StormResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("bench storm -o json: %v\n%s", err, out)
	}
	ro := r.Rotation
	if r.Certified != 20 || ro == nil {
		t.Fatalf("bench storm -rotate: %+v", r)
	}
	if !ro.NewKey || ro.Pods != 20 || ro.Rotated != 20 || ro.Seconds <= 0 || ro.Commands < 20 {
		t.Fatalf("rotation: %+v", *ro)
	}
}

// A storm that cannot read the signer's metrics says wasted=unknown and fails:
// it used to print wasted=0 and succeed, whatever the signer had wasted.
func TestBenchStormUnreadMetricIsAFailure(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	st.Signer.HTTP = testkit.FreeAddr(t) // nothing answers there
	if err := stackfile.Write(dir, st); err != nil {
		t.Fatal(err)
	}
	out, err := meshctl(t, "bench", "storm", "-dir", dir, "-pods", "5", "-timeout", "25s")
	if err == nil || !errors.Is(err, loadgen.ErrUnread) {
		t.Fatalf("bench storm with the signer's metrics unreadable: %v\n%s", err, out)
	}
	if !strings.HasPrefix(out, "pods=5 certified=5 failed=0 wasted=unknown in ") {
		t.Fatalf("bench storm with the signer's metrics unreadable:\n%s", out)
	}
}
