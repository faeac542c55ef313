package devstack

import (
	"bytes"
	"os"
	"testing"
)

// meshctl up makes the signer's KEK once, owner-only, and reuses it, so the sealed
// root in the state directory stays readable across restarts.
func TestCAKEKIsMadeOnceAndReused(t *testing.T) {
	dir := t.TempDir()
	p, err := CAKEK(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(p)
	if st.Mode().Perm() != 0o600 || len(first) != 32 || bytes.Equal(first, make([]byte, 32)) {
		t.Fatalf("kek mode %v, %d bytes", st.Mode().Perm(), len(first))
	}
	again, err := CAKEK(dir)
	if err != nil || again != p {
		t.Fatalf("second call: %s, %v", again, err)
	}
	if second, _ := os.ReadFile(p); !bytes.Equal(first, second) {
		t.Fatal("kek replaced: the sealed root would no longer open")
	}
}
