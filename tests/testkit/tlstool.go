package testkit

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A TLS stack other than Go's, driven through its command-line tool: what Envoy
// (BoringSSL) and most other peers (OpenSSL) verify a chain with. Go's verifier builds
// paths by signature and accepts chains these two reject (a cross-signed certificate
// without an Authority Key Identifier), so chain shapes are tested in all three.
const (
	StackOpenSSL   = "openssl"   // OpenSSL 3's s_client
	StackBoringSSL = "bssl-tool" // BoringSSL's tool (Debian's android-boringssl)
)

// RequireBSSLEnv makes TLSTool fail instead of skipping when a tool is missing
// (.ci/run sets it after installing android-boringssl).
const RequireBSSLEnv = "MESHAGENT_REQUIRE_BSSL"

// TLSTool is the path of stack's tool. When it is missing the test is skipped,
// or fails where MESHAGENT_REQUIRE_BSSL is set.
func TLSTool(t testing.TB, stack string) string {
	t.Helper()
	p, err := exec.LookPath(stack)
	if err == nil {
		return p
	}
	if os.Getenv(RequireBSSLEnv) != "" {
		t.Fatalf("%s is required (%s is set) and missing: apt-get install -y android-boringssl openssl", stack, RequireBSSLEnv)
	}
	t.Skipf("%s not installed (apt-get install -y android-boringssl openssl; set %s=1 to fail instead)", stack, RequireBSSLEnv)
	return ""
}

// toolTimeout bounds one handshake by a tool, its start included.
const toolTimeout = 20 * time.Second

// ToolAccepts runs one TLS handshake on loopback: a Go server presents chain (leaf
// first, exactly as given, root included or not) with key, and stack's tool connects
// as the client trusting roots alone, with verification required. It returns nil
// when the tool verified the chain and completed the handshake, or an error holding
// the tool's output. The server takes the first port the kernel gives a listener
// it holds from the start, so nothing can take it in between.
func ToolAccepts(t testing.TB, stack string, chain []*x509.Certificate, key crypto.Signer, roots []*x509.Certificate) error {
	t.Helper()
	tool := TLSTool(t, stack)
	dir := t.TempDir()
	rootsFile := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(rootsFile, CertsPEM(roots), 0o600); err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{PrivateKey: key}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	var wg sync.WaitGroup
	serverErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := srv.Accept()
		if err != nil {
			serverErr <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(toolTimeout))
		serverErr <- c.(*tls.Conn).HandshakeContext(ctx)
		// Hold the connection until the tool leaves, so it reads the session
		// tickets and alerts and exits on its own.
		_, _ = c.Read(make([]byte, 1))
	}()
	defer wg.Wait()
	defer ln.Close()

	addr := ln.Addr().String()
	var args []string
	switch stack {
	case StackOpenSSL:
		args = []string{"s_client", "-connect", addr, "-CAfile", rootsFile, "-no-CApath", "-no-CAstore",
			"-verify_return_error", "-brief"}
	case StackBoringSSL:
		args = []string{"client", "-connect", addr, "-root-certs", rootsFile}
	default:
		t.Fatalf("unknown TLS stack %q", stack)
	}
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stdin = bytes.NewReader(nil) // EOF at once: the tool closes after the handshake
	out, runErr := cmd.CombinedOutput()
	ln.Close()
	text := strings.TrimSpace(string(out))
	if ctx.Err() != nil {
		return fmt.Errorf("%s: no result within %s: %s", stack, toolTimeout, text)
	}
	ok := false
	switch stack {
	case StackOpenSSL:
		ok = runErr == nil && strings.Contains(text, "Verification: OK")
	case StackBoringSSL:
		ok = runErr == nil && strings.Contains(text, "Connected.")
	}
	if !ok {
		return fmt.Errorf("%s rejected the chain (%v): %s", stack, runErr, lastLines(text, 6))
	}
	select {
	case err := <-serverErr:
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("%s connected but the Go server's handshake failed: %w", stack, err)
		}
	case <-ctx.Done():
		return fmt.Errorf("%s: the Go server did not finish its handshake", stack)
	}
	return nil
}

// CertsPEM encodes certs as one PEM bundle.
func CertsPEM(certs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
