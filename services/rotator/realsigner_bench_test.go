package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/testkit"
	"github.com/nats-io/nats-server/v2/server"
)

// signerStack is a nats-server with JetStream on a loopback TCP port, the real
// signer binary on it (its CA, the event stream), and pod-bound service-account
// tokens for meshctl bench sign: token i is pod bench-i's, so that every
// certificate issued with it is recorded for its own pod.
type signerStack struct {
	ns      *server.Server
	signer  *testkit.Service
	meshctl string
	tokens  string // file, one token per line
}

func startSignerStack(b *testing.B, pods int) *signerStack {
	ns := bustest.Server(b)
	dir := testkit.ShortDir(b)
	iss, err := devtoken.LoadOrCreate(filepath.Join(dir, "issuer"))
	if err != nil {
		b.Fatal(err)
	}
	kek := filepath.Join(dir, "kek")
	if err := os.WriteFile(kek, bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		b.Fatal(err)
	}
	signer := testkit.StartService(b, "signer", []string{"-instance", "rotator-bench", "-nats-url", ns.ClientURL(),
		"-grpc-addr", testkit.FreeAddr(b), "-jwks-file", devtoken.JWKSPath(filepath.Join(dir, "issuer")),
		"-token-issuer", iss.Name, "-ca-kek-file", kek, "-log-level", "warn"})
	var toks strings.Builder
	now := time.Now().Add(-time.Second)
	for i := range pods {
		tok, err := iss.MintForPod("bench", fmt.Sprintf("sa-%d", i%100), fmt.Sprintf("bench-%d", i), "", 2*time.Hour, now)
		if err != nil {
			b.Fatal(err)
		}
		toks.WriteString(tok + "\n")
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(toks.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	return &signerStack{ns: ns, signer: signer, meshctl: testkit.Binary(b, "meshctl"), tokens: tokens}
}

// signBench is the part of meshctl bench sign's -o json the benchmarks read.
type signBench struct {
	CSRs     int     `json:"csrs"`
	Rate     float64 `json:"csrs_per_second"`
	P50Micro int64   `json:"p50_us"`
	P99Micro int64   `json:"p99_us"`
	CPUMicro float64 `json:"signer_cpu_us_per_csr"`
}

// benchSign runs meshctl bench sign against the stack's signer: n P-256 CSRs, 32
// in flight, token i for CSR i, with more flags (-warmup, ...).
func (s *signerStack) benchSign(b *testing.B, n int, more ...string) signBench {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append([]string{"bench", "sign", "-nats-url", s.ns.ClientURL(), "-tokens", s.tokens,
		"-signer-pid", strconv.Itoa(s.signer.Pid()), "-n", strconv.Itoa(n), "-in-flight", "32",
		"-key-alg", "EC-P256", "-o", "json"}, more...)
	out, err := exec.CommandContext(ctx, s.meshctl, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		b.Fatalf("meshctl bench sign: %v\n%s\nsigner log:\n%s", err, stderr, s.signer.Logs.String())
	}
	var r signBench
	if err := json.Unmarshal(out, &r); err != nil || r.CSRs == 0 || r.Rate <= 0 {
		b.Fatalf("meshctl bench sign output %q: %v", out, err)
	}
	return r
}
