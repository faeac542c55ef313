package loadgen

import (
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// The storm's tally counts an error by its kind: the addresses and each pod's
// token file are left out, so a 10,000-pod storm prints one line per kind, not
// one per pod; "i/o timeout" keeps its slash.
func TestErrTallyCountsKinds(t *testing.T) {
	tally := &errTally{counts: map[string]int{}}
	for _, err := range []string{
		"open /tmp/meshctl-storm-1/storm-7: too many open files",
		"open /tmp/meshctl-storm-1/storm-8: too many open files",
		"dial tcp 127.0.0.1:4222: i/o timeout",
		"dial tcp 127.0.0.1:4223: i/o timeout",
	} {
		tally.Accept("", hclog.Debug, "connect failed", "error", errors.New(err))
	}
	got := tally.snapshot()
	want := map[string]int{"open <file>: too many open files": 2, "dial tcp <addr>: i/o timeout": 2}
	if len(got) != len(want) {
		t.Fatalf("tally %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("tally %v, want %v", got, want)
		}
	}
}
