package certdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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

// TestWriteIsOneSet: a reader of OUTPUT_CERTS saw key.pem and cert-chain.pem of
// different renewals while two renewals wrote them (sds-edge, issue 37). Writers
// race here with sets that each name themselves; a reader that resolves DataLink
// once always reads one set, and one of the sets written, never a mix, never an
// empty file. The old layout's regular files are replaced by the links.
func TestWriteIsOneSet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{KeyFile, ChainFile, RootFile} { // the layout before
		if err := os.WriteFile(filepath.Join(dir, n), []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	set := func(i int) (k, c, r []byte) {
		return []byte(fmt.Sprintf("key %d", i)), []byte(fmt.Sprintf("chain %d", i)), []byte(fmt.Sprintf("roots %d", i))
	}
	write := func(i int) error { k, c, r := set(i); return Write(dir, k, c, r) }
	if err := write(0); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 1 + w; i < 400; i += 2 {
				if err := write(i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	reads := 0
	for {
		select {
		case <-done:
			if reads == 0 {
				t.Fatal("nothing read")
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 6 {
				t.Fatalf("%d entries left in the directory, want the link, its set, the one before and the three names", len(entries))
			}
			return
		default:
		}
		target, err := os.Readlink(filepath.Join(dir, DataLink))
		if err != nil {
			t.Fatal(err)
		}
		var got [3]string
		gone := false
		for i, n := range []string{KeyFile, ChainFile, RootFile} {
			b, err := os.ReadFile(filepath.Join(dir, target, n))
			if errors.Is(err, os.ErrNotExist) {
				gone = true // two writes since it resolved: resolve again
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got[i] = string(b)
		}
		if gone {
			continue
		}
		var i int
		if _, err := fmt.Sscanf(got[0], "key %d", &i); err != nil {
			t.Fatalf("key.pem holds %q", got[0])
		}
		if k, c, r := set(i); got != [3]string{string(k), string(c), string(r)} {
			t.Fatalf("one read mixed sets: %q", got)
		}
		for _, n := range []string{KeyFile, ChainFile, RootFile} {
			if fi, err := os.Lstat(filepath.Join(dir, n)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("%s is not a link through %s (%v)", n, DataLink, err)
			}
		}
		reads++
	}
}

func TestWriteRefusesAnEmptyPartAndKeepsTheSet(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, []byte("key"), []byte("chain"), []byte("roots")); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, []byte("key2"), []byte("chain2"), nil); err == nil {
		t.Fatal("empty roots written")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, RootFile)); string(b) != "roots" {
		t.Fatalf("root-cert.pem holds %q", b)
	}
}
