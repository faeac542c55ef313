package ca

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A named signer's material is read from <dir>/<name>/, re-read after signerReload,
// and kept when the new files are broken; names outside CERT_SIGNERS, or that would
// leave the directory, are refused.
func TestNamedSignersReadAndKeepLastGood(t *testing.T) {
	dir := t.TempDir()
	root := testkit.NewCA(t, "partner-root", nil, t0, 48*time.Hour)
	if err := os.Mkdir(filepath.Join(dir, "partner"), 0o700); err != nil {
		t.Fatal(err)
	}
	signertest.WriteCACerts(t, filepath.Join(dir, "partner"), root, nil, root.Cert)
	n := NewNamedSigners(dir, []string{"partner", "..", "missing"})
	m, err := n.Material("partner", t0)
	if err != nil || m.RootFingerprint() == "" || !m.Chain[len(m.Chain)-1].Equal(root.Cert) {
		t.Fatalf("partner: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "partner", CAKeyFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if again, err := n.Material("partner", t0.Add(time.Minute)); err != nil || again != m {
		t.Fatalf("broken files replaced good material: %v", err)
	}
	for name, want := range map[string]string{"other": "not allowed", "..": "not allowed", "missing": filepath.Join(dir, "missing")} {
		if _, err := n.Material(name, t0); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", name, err, want)
		}
	}
	if _, err := NewNamedSigners("", []string{"partner"}).Material("partner", t0); err == nil || !strings.Contains(err.Error(), "-cert-signers-dir") {
		t.Errorf("no dir: %v", err)
	}
}
