package stackfile

import (
	"strings"
	"testing"
)

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
