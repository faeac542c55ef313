package cli

import (
	"strings"
	"testing"
)

func TestBenchSignRefusesBadFlagsAtOnce(t *testing.T) {
	_, err := run(t, "bench", "sign", "-n", "0", "-in-flight", "0", "-key-alg", "dsa", "-o", "yaml", "-dir", t.TempDir())
	if err == nil {
		t.Fatal("bad flags accepted")
	}
	for _, want := range []string{"-n:", "-in-flight:", "-key-alg:", "-o:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if _, err := run(t, "bench", "nothing"); err == nil {
		t.Fatal("unknown benchmark accepted")
	}
}
