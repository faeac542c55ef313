package loadgen

import (
	"strings"
	"testing"
)

// A storm's text starts with the line its runs are compared by.
func TestStormResultFirstLine(t *testing.T) {
	var b strings.Builder
	StormResult{Pods: 10, Certified: 9, Failed: 1, Wasted: 2, Seconds: 1.5}.WriteText(&b)
	if first, _, _ := strings.Cut(b.String(), "\n"); first != "pods=10 certified=9 failed=1 wasted=2 in 1.50 s" {
		t.Fatalf("first line %q", first)
	}
}

// Every bad value is reported at once, naming its flag.
func TestConfigsNameEveryBadFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"storm", StormConfig{Layout: Layout{Pods: 0, ConnsPerPod: 4}, Rotate: "sideways"}.Validate(), []string{"-pods:", "-conns:", "-timeout:", "-rotate:"}},
		{"sign", SignConfig{Warmup: -1, Duration: -1, Subject: "all"}.Validate(), []string{"-n:", "-in-flight:", "-warmup:", "-duration:", "-subject:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				if tc.err == nil || !strings.Contains(tc.err.Error(), w) {
					t.Errorf("error %v does not name %s", tc.err, w)
				}
			}
		})
	}
	if err := (StormConfig{Layout: Layout{Pods: 1, ConnsPerPod: 1}, Timeout: 1, Rotate: RotateNone}).Validate(); err != nil {
		t.Fatalf("a good storm config refused: %v", err)
	}
}
