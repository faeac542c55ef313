package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/loadgen"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/tests/testkit"
)

// meshctl bench sign against a local stack's real signer: every CSR answered, the
// signer's CPU read from its process, and no p99 from too few samples.
func TestBenchSignLoadsTheStacksSigner(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	const issued, repeated = `meshagent_signer_certs_issued_total{transport="nats"}`, `meshagent_signer_requests_repeated_total{transport="nats"}`
	issued0 := metric(t, st.Signer.HTTP, issued)
	out, err := meshctl(t, "bench", "sign", "-dir", dir, "-n", "60", "-warmup", "5", "-in-flight", "4", "-o", "json")
	if err != nil {
		t.Fatalf("bench sign: %v\n%s", err, out)
	}
	var r loadgen.SignResult
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
	// Every request signed, the warmup's too: none is a repeat, which the signer
	// would answer with the certificate it recorded, unsigned.
	if got, rep := metric(t, st.Signer.HTTP, issued)-issued0, metric(t, st.Signer.HTTP, repeated); got != 65 || rep != 0 {
		t.Fatalf("bench sign -n 60 -warmup 5: %v certificates issued and %v repeats, want 65 and 0", got, rep)
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
	// With -duration the 20 keys are cycled through, each time with a new CSR and as
	// an identity of its own (as the same identity, the signer's limit of early
	// certificates per identity and minute would end the run within a second).
	issued0 = metric(t, st.Signer.HTTP, issued)
	out, err = meshctl(t, "bench", "sign", "-dir", dir, "-n", "20", "-warmup", "0", "-in-flight", "4", "-duration", "1s", "-o", "json")
	if err != nil {
		t.Fatalf("bench sign -duration: %v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.CSRs <= 20 {
		t.Fatalf("bench sign -duration 1s -n 20 sent %d requests (%v): the keys were not cycled through\n%s", r.CSRs, err, out)
	}
	if got, rep := metric(t, st.Signer.HTTP, issued)-issued0, metric(t, st.Signer.HTTP, repeated); got != float64(r.CSRs) || rep != 0 {
		t.Fatalf("bench sign -duration: %d requests, %v certificates issued and %v repeats; want one certificate each", r.CSRs, got, rep)
	}
}
