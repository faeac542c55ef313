package filecerts

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestConfine(t *testing.T) {
	base := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(base, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(name, target string) string {
		p := filepath.Join(base, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	in := mk("pod/etc/certs/..2026_1/cert.pem")
	secret := mk("secrets/ca-key.pem")
	link("pod/etc/certs/..data", "..2026_1")
	k8s := link("pod/etc/certs/cert.pem", "..data/cert.pem")
	out := link("pod/etc/certs/key.pem", secret)
	link("pod/etc/certs/up", "../../../secrets")
	// A root that is itself a symlink (/var/run -> /run on most systems).
	mk("run/secrets/root.pem")
	link("var", "run")
	roots := []string{filepath.Join(base, "pod/etc/certs"), filepath.Join(base, "var/secrets")}
	for _, c := range []struct {
		name, path string
		roots      []string
		want       string // "" refused
		outside    bool
	}{
		{"a file in a root", in, roots, in, false},
		{"Kubernetes' ..data symlinks", k8s, roots, in, false},
		{"through a symlinked root", filepath.Join(base, "var/secrets/root.pem"), roots, filepath.Join(base, "run/secrets/root.pem"), false},
		{"outside", secret, roots, "", true},
		{"missing outside: same error as present", filepath.Join(base, "secrets/nope"), roots, "", true},
		{"missing inside: not found", filepath.Join(base, "pod/etc/certs/nope"), roots, "", false},
		{"..", filepath.Join(base, "pod/etc/certs") + "/../../../secrets/ca-key.pem", roots, "", true},
		{"a prefix is not a parent", filepath.Join(base, "pod/etc/certs-evil/x"), roots, "", true},
		{"symlinked file pointing out", out, roots, "", true},
		{"symlinked directory pointing out", filepath.Join(base, "pod/etc/certs/up/ca-key.pem"), roots, "", true},
		{"no roots", in, nil, "", true},
		{"/ is anywhere", secret, []string{"/"}, secret, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := confine(c.path, c.roots)
			if got != c.want {
				t.Fatalf("confine = %q, %v; want %q", got, err, c.want)
			}
			if c.want == "" && (err == nil || errors.Is(err, ErrOutside) != c.outside) {
				t.Fatalf("error %v, outside %v", err, c.outside)
			}
		})
	}
}
