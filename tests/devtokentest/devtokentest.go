// Package devtokentest runs the real signer binary for tests and benchmarks,
// trusting a dev token issuer (package devtoken) that the test mints tokens with,
// and loads it with meshctl bench sign.
package devtokentest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/tests/testkit"
)

// StartSigner starts the signer binary (testkit.StartService) on the bus at
// natsURL, with a fresh dev issuer's JWKS as its token keys, a KEK sealing its
// CA, a free gRPC port and more flags, and returns the issuer and the service.
func StartSigner(t testing.TB, natsURL string, more ...string) (*devtoken.Issuer, *testkit.Service) {
	t.Helper()
	dir := testkit.ShortDir(t)
	iss, err := devtoken.LoadOrCreate(filepath.Join(dir, "issuer"))
	if err != nil {
		t.Fatal(err)
	}
	kek := filepath.Join(dir, "kek")
	if err := os.WriteFile(kek, bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-nats-url", natsURL, "-grpc-addr", testkit.FreeAddr(t),
		"-jwks-file", devtoken.JWKSPath(filepath.Join(dir, "issuer")), "-token-issuer", iss.Name,
		"-ca-kek-file", kek, "-log-level", "warn"}, more...)
	return iss, testkit.StartService(t, "signer", args)
}

// SignBench is the part of meshctl bench sign's -o json that tests read.
type SignBench struct {
	CSRs     int     `json:"csrs"`
	Rate     float64 `json:"csrs_per_second"`
	P50Micro int64   `json:"p50_us"`
	P99Micro int64   `json:"p99_us"`
	CPUMicro float64 `json:"signer_cpu_us_per_csr"`
}

// BenchSign runs meshctl bench sign (testkit.Binary) against signer on the bus
// at natsURL: n P-256 CSRs, 32 in flight, the tokens in the file tokens (token i
// for CSR i, cycled), the signer's CPU read from its pid, and more flags
// (-warmup, -subject, ...). It fails t with the signer's log if the run fails.
func BenchSign(t testing.TB, natsURL string, signer *testkit.Service, tokens string, n int, more ...string) SignBench {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append([]string{"bench", "sign", "-nats-url", natsURL, "-tokens", tokens,
		"-signer-pid", strconv.Itoa(signer.Pid()), "-n", strconv.Itoa(n), "-in-flight", "32",
		"-key-alg", "EC-P256", "-o", "json"}, more...)
	out, err := exec.CommandContext(ctx, testkit.Binary(t, "meshctl"), args...).Output()
	if err != nil {
		var ee *exec.ExitError
		var stderr []byte
		if errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("meshctl bench sign: %v\n%s\nsigner log:\n%s", err, stderr, signer.Logs.String())
	}
	var r SignBench
	if err := json.Unmarshal(out, &r); err != nil || r.CSRs == 0 || r.Rate <= 0 {
		t.Fatalf("meshctl bench sign output %q: %v", out, err)
	}
	return r
}
