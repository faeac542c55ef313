package devstack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// Material an older meshctl (or a copy, or a loose umask) left readable by others
// is made owner-only before the stack starts; certificates may stay readable.
func TestProtectSecretsTightensLooseModes(t *testing.T) {
	dir := t.TempDir()
	files := map[string]os.FileMode{
		"secrets/signer.nk":                     0o644,
		"secrets/ca-kek":                        0o640,
		"secrets/signers/partner/ca-key.pem":    0o644,
		"secrets/signers/partner/ca-cert.pem":   0o644,
		"secrets/bus-tls/ca.pem":                0o644,
		"secrets/bus-tls/ca-key.pem":            0o604,
		"issuer/key.pem":                        0o666,
		"secrets/signers/partner/root-cert.pem": 0o644,
	}
	for f, m := range files {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), m); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := protectSecrets(dir, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	for f, was := range files {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		want := was & 0o600
		if publicFile(filepath.Base(f)) {
			want = was
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: %#o, want %#o", f, fi.Mode().Perm(), want)
		}
	}
	for _, d := range []string{"secrets", "secrets/signers", "secrets/signers/partner", "secrets/bus-tls", "issuer"} {
		if fi, err := os.Stat(filepath.Join(dir, d)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v", d, fi.Mode(), err)
		}
	}
	// A stack that has none yet is no error.
	if err := protectSecrets(t.TempDir(), hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
}
