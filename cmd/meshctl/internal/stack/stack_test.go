package stack

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

func TestWriteAndReadStack(t *testing.T) {
	dir := t.TempDir()
	in := &Stack{Version: 1, NATSURL: "nats://x", Pods: []Pod{{ID: "demo-0", HTTP: map[string]string{"sds-edge": "a"}}}}
	if err := Write(dir, in); err != nil {
		t.Fatal(err)
	}
	out, err := Read(dir)
	if err != nil || out.NATSURL != "nats://x" || out.Pods[0].HTTP["sds-edge"] != "a" {
		t.Fatalf("read back %+v, %v", out, err)
	}
	if _, err := Read(t.TempDir()); err == nil || !strings.Contains(err.Error(), "is meshctl up running?") {
		t.Fatalf("missing stack.json: %v", err)
	}
}

func TestFindBinaryNamesWhatItTried(t *testing.T) {
	_, err := findBinary(t.TempDir(), "no-such-service-binary")
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("err = %v", err)
	}
}
