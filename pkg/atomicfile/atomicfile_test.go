package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReplacesWithExactlyTheMode(t *testing.T) {
	tests := []struct {
		name string
		old  os.FileMode // 0: no file before
		mode os.FileMode
	}{
		{"new key file", 0, 0o600},
		{"looser key file tightened", 0o644, 0o600},
		{"public file", 0o600, 0o644},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f.pem")
			if tt.old != 0 {
				if err := os.WriteFile(path, []byte("old"), tt.old); err != nil {
					t.Fatal(err)
				}
			}
			if err := Write(path, []byte("new"), tt.mode); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil || fi.Mode().Perm() != tt.mode {
				t.Fatalf("mode %v, want %v (%v)", fi.Mode().Perm(), tt.mode, err)
			}
			if b, _ := os.ReadFile(path); string(b) != "new" {
				t.Fatalf("content %q", b)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Fatalf("left behind: %v", ents)
			}
		})
	}
}

func TestWriteFailsNamingThePathAndChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing-dir", "f")
	err := Write(path, []byte("x"), 0o600)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("stat: %v", err)
	}
}
