package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestVersionSetAtBuildTimeWins(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v1.2.3-4-gabcdef"
	if got := String("signer"); got != "signer v1.2.3-4-gabcdef ("+runtime.Version()+", "+runtime.GOOS+"/"+runtime.GOARCH+")" {
		t.Fatalf("String: %q", got)
	}
	Version = ""
	if got := Get(); got == "" || strings.Contains(got, " ") {
		t.Fatalf("Get without -X: %q", got)
	}
}

func TestAsked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"-version"}, true},
		{[]string{"--version"}, true},
		{[]string{"version"}, true},
		{[]string{"sds-edge", "-version"}, true},
		{[]string{"sds-edge", "version"}, false}, // a role's word, not ours
		{[]string{"-nats-url", "nats://x"}, false},
		{nil, false},
	} {
		if got := Asked(tc.args); got != tc.want {
			t.Errorf("Asked(%q) = %v", tc.args, got)
		}
	}
}
