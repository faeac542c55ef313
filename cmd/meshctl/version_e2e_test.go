package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEveryBinaryAnswersVersionAndHelp: each binary the stack runs prints its
// version for -version (and the word version) and its flags for -h, and exits 0
// for both (issue 29: no binary reported a version, meshagent -h exited 1).
func TestEveryBinaryAnswersVersionAndHelp(t *testing.T) {
	meshagent := filepath.Join(t.TempDir(), "meshagent")
	if out, err := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", meshagent, "github.com/meshagent/meshagent/cmd/meshagent").CombinedOutput(); err != nil {
		t.Fatalf("build meshagent: %v\n%s", err, out)
	}
	runIt := func(bin string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		return string(out), err
	}
	for _, name := range []string{"signer", "rotator", "operator", "sds-edge", "xds-relay", "launcher", "meshagent"} {
		bin := filepath.Join(binDir, name)
		if name == "meshagent" {
			bin = meshagent
		}
		for _, v := range []string{"-version", "version"} {
			out, err := runIt(bin, v)
			if err != nil || !strings.HasPrefix(out, name+" ") || !strings.Contains(out, "go1.") {
				t.Errorf("%s %s: %v\n%s", name, v, err, out)
			}
		}
		if out, err := runIt(bin, "-h"); err != nil || !strings.Contains(strings.ToLower(out), "usage") {
			t.Errorf("%s -h: %v\n%s", name, err, out)
		}
	}
	if out, err := runIt(meshagent, "sds-edge", "-h"); err != nil || !strings.Contains(out, "-socket") {
		t.Errorf("meshagent sds-edge -h: %v\n%s", err, out)
	}
	if out, err := runIt(filepath.Join(binDir, "envoy-standin"), "-h"); err != nil || !strings.Contains(out, "usage") {
		t.Errorf("envoy-standin -h: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"version"}, {"-version"}} {
		out, err := meshctl(t, args...)
		if err != nil || !strings.HasPrefix(out, "meshctl ") {
			t.Errorf("meshctl %v: %v\n%s", args, err, out)
		}
	}
}
