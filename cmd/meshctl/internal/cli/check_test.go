package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// TestCheckFailsOnAnOpenBus: a bus without meshagent's roles (any credential may
// read the sign requests), with no event streams and no signer: check exits
// non-zero and says what to fix for each.
func TestCheckFailsOnAnOpenBus(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	// The nkey user may do anything: no roles.
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	nk := filepath.Join(t.TempDir(), "audit.nk")
	if err := os.WriteFile(nk, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "check", "-nats-url", s.ClientURL(), "-nats-nkey", nk)
	if err == nil || !strings.Contains(err.Error(), "check(s) failed") {
		t.Fatalf("check on an open bus: %v\n%s", err, out)
	}
	for _, want := range []string{"ok   bus", "FAIL roles enforced", "fix: run the bus with meshagent's roles", "FAIL stream MESHAGENT_EVENTS",
		"fix: start the service that owns it (a signer creates it)", "FAIL signers", "fix: start a signer"} {
		if !strings.Contains(out, want) {
			t.Errorf("check lacks %q:\n%s", want, out)
		}
	}
}

// TestRedactKeepsSecretsOutOfTheBundle: a log line holding a token, a private key
// or an nkey seed reaches the bug report without it.
func TestRedactKeepsSecretsOutOfTheBundle(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	in := "token eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz here\n" +
		"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB\n-----END EC PRIVATE KEY-----\nseed " + string(seed) + " end\nkeep this line"
	out := string(redact([]byte(in)))
	for _, secret := range []string{"eyJhbGci", "MHcCAQEEIB", string(seed)} {
		if strings.Contains(out, secret) {
			t.Errorf("redacted log still holds %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "keep this line") || !strings.Contains(out, "<redacted token> here") {
		t.Errorf("redaction took too much:\n%s", out)
	}
}
