package testkit

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// OpenSSLVerifies checks chain (leaf first, as a peer presents it, root included or
// not) with `openssl verify` against roots alone: the leaf verifies when OpenSSL
// builds a path from it through chain[1:] (untrusted) to one of roots, at the
// current time. It returns nil when OpenSSL says OK, or an error holding its output.
// Where a real handshake is possible (the key is at hand), ToolAccepts is the
// stronger check; this one needs no key, so it can check what a pod serves.
func OpenSSLVerifies(t testing.TB, chain, roots []*x509.Certificate) error {
	t.Helper()
	return OpenSSLVerifiesFor(t, "", chain, roots)
}

// OpenSSLVerifiesFor is OpenSSLVerifies for a purpose (`openssl verify -purpose`:
// sslclient, sslserver, ...; "": any), which OpenSSL checks against the leaf's
// key usages: what a TLS server checks of a client's chain (sslclient) or a
// client of a server's (sslserver).
func OpenSSLVerifiesFor(t testing.TB, purpose string, chain, roots []*x509.Certificate) error {
	t.Helper()
	tool := TLSTool(t, StackOpenSSL)
	if len(chain) == 0 || len(roots) == 0 {
		return fmt.Errorf("openssl verify: nothing to verify (%d certificates, %d roots)", len(chain), len(roots))
	}
	dir := t.TempDir()
	write := func(name string, certs []*x509.Certificate) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, CertsPEM(certs), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	args := []string{"verify", "-no-CApath", "-no-CAstore", "-CAfile", write("roots.pem", roots)}
	if purpose != "" {
		args = append(args, "-purpose", purpose)
	}
	if len(chain) > 1 {
		args = append(args, "-untrusted", write("untrusted.pem", chain[1:]))
	}
	leaf := write("leaf.pem", chain[:1])
	args = append(args, leaf)
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, tool, args...).CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil || text != leaf+": OK" {
		return fmt.Errorf("openssl verify rejected the chain (%v): %s", err, lastLines(text, 6))
	}
	return nil
}
