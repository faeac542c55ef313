package certdir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteLaysOutIstiosFilesWithTheirModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "certs")
	if err := Write(dir, []byte("key"), []byte("chain"), []byte("roots")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name, data string
		mode       os.FileMode
	}{{KeyFile, "key", 0o600}, {ChainFile, "chain", 0o644}, {RootFile, "roots", 0o644}} {
		fi, err := os.Stat(filepath.Join(dir, f.name))
		if err != nil || fi.Mode().Perm() != f.mode {
			t.Fatalf("%s: mode %v, want %v (%v)", f.name, fi.Mode().Perm(), f.mode, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, f.name)); string(b) != f.data {
			t.Fatalf("%s holds %q", f.name, b)
		}
	}
}
