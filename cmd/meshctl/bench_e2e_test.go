package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/cli"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/testkit"
)

// meshctl bench sign against a local stack's real signer: every CSR answered, the
// signer's CPU read from its process, and no p99 from too few samples.
func TestBenchSignLoadsTheStacksSigner(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	out, err := meshctl(t, "bench", "sign", "-dir", dir, "-n", "60", "-warmup", "5", "-in-flight", "4", "-o", "json")
	if err != nil {
		t.Fatalf("bench sign: %v\n%s", err, out)
	}
	var r cli.SignBench
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("bench sign -o json: %v\n%s", err, out)
	}
	if r.CSRs != 60 || r.Rate <= 0 || r.P50Micro <= 0 {
		t.Fatalf("bench sign: %+v", r)
	}
	if r.P99Micro != 0 {
		t.Fatalf("p99 reported from %d samples: %+v", r.CSRs, r)
	}
	if !strings.HasPrefix(r.CPUSource, "/proc/") || r.SignerCPUMicro <= 0 {
		t.Fatalf("signer CPU not read from its process: %+v", r)
	}
	// Its certificates are marked (namespace meshagent-bench): in the inventory, but
	// out of certs and status unless asked for.
	var last string
	if !testkit.Poll(time.Minute, func() bool {
		out, err := meshctl(t, "certs", "-dir", dir, "-bench")
		last = fmt.Sprint(out, err)
		return err == nil && strings.Count(out, "/ns/meshagent-bench/") == 60
	}) {
		t.Fatalf("certs -bench does not list the bench's 60 certificates (one per identity: -n 60 tokens):\n%s", last)
	}
	if out, err := meshctl(t, "certs", "-dir", dir); err != nil || strings.Contains(out, "meshagent-bench/") ||
		!strings.Contains(out, "60 certificate(s) of meshctl bench (namespace meshagent-bench) left out") {
		t.Fatalf("certs without -bench: %v\n%s", err, out)
	}
	if out, _ := meshctl(t, "status", "-dir", dir); !strings.Contains(out, "60 certificate(s) of meshctl bench (namespace meshagent-bench) not counted") ||
		!strings.Contains(out, "certificates   0 current") {
		t.Fatalf("status after the bench:\n%s", out)
	}
	// Tokens the signer does not accept end the run with the signer's refusal.
	bad := filepath.Join(dir, "bad-tokens")
	if err := os.WriteFile(bad, []byte("not-a-jwt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := meshctl(t, "bench", "sign", "-dir", dir, "-tokens", bad, "-n", "3", "-warmup", "0"); err == nil || !strings.Contains(err.Error(), "unauthenticated") {
		t.Fatalf("bench sign with bad tokens: %v\n%s", err, out)
	}
}
