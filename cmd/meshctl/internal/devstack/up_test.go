package devstack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPodsDirStaysUnderDirWhenSocketsFit(t *testing.T) {
	dir, err := os.MkdirTemp("", "ma")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	got, err := podsDir(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(dir, "pods") {
		t.Fatalf("pods dir %s, want under %s", got, dir)
	}
}

func TestPodsDirMovesWhenDirIsTooDeep(t *testing.T) {
	deep := filepath.Join(t.TempDir(), strings.Repeat("d", 60))
	got, err := podsDir(deep, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(got)
	if strings.HasPrefix(got, deep) {
		t.Fatalf("pods dir %s is still under the deep dir", got)
	}
	if sock := filepath.Join(got, "demo-0", longestSocket); len(sock) > maxSocketPath {
		t.Fatalf("socket path %d bytes", len(sock))
	}
}
