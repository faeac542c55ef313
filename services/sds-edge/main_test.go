package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestRunServesHealthAndSecrets runs the whole binary's run() (lifecycle.Serve with
// package sdsedge) in file-mounted mode
// (no CA needed) and checks /healthz, /readyz, /metrics and the socket.
func TestRunServesHealthAndSecrets(t *testing.T) {
	ns := bustest.Server(t)
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if _, err := bus.EnsureEventStream(sctx, bustest.JetStream(t, bustest.Conn(t, ns)), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", "ma")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	creds := filepath.Join(root, "var/run/secrets/workload-spiffe-credentials")
	if err := os.MkdirAll(creds, 0o755); err != nil {
		t.Fatal(err)
	}
	self := testkit.SelfSigned(t, testkit.Spec{Name: "self", IsCA: true})
	c := self.Cert
	key, _ := pki.EncodeKeyPEM(self.Key, false)
	for n, b := range map[string][]byte{"cert-chain.pem": pki.EncodeCertPEM(c), "key.pem": key, "root-cert.pem": pki.EncodeCertPEM(c)} {
		if err := os.WriteFile(filepath.Join(creds, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := testkit.FreeAddr(t)
	env := map[string]string{"POD_NAME": "web-0", "POD_ROOT": root, "NATS_URL": ns.ClientURL(), "HTTP_ADDR": addr, "LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }) }()

	get := func(path string) (int, string) { return testkit.HTTPGet("http://" + addr + path) }
	testkit.Eventually(t, "/readyz answers 200", func() bool { code, _ := get("/readyz"); return code == 200 })
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if _, body := get("/metrics"); !strings.Contains(body, `meshagent_sds_edge_cert_expiry_seconds{resource="default"}`) {
		t.Fatalf("metrics lack the expiry gauge:\n%s", body)
	}
	cc, _ := sdsclient.DialUnix(ctx, filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"))
	defer cc.Close()
	got, err := sdsclient.Fetch(ctx, cc, "n", "default")
	if err != nil || !got["default"].IsCertificate() {
		t.Fatalf("fetch: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v on cancellation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	err := run(context.Background(), []string{"-key-alg", "dsa"}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "-pod") || !strings.Contains(err.Error(), "-key-alg") {
		t.Fatalf("run with bad config: %v", err)
	}
}
