package signer

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind: every signer,
// listener and watcher must stop when its context ends. Started by a benchmark as
// its confined ceiling (ceilingChildEnv), the binary only measures that.
func TestMain(m *testing.M) {
	if spec := os.Getenv(ceilingChildEnv); spec != "" {
		os.Exit(runCeilingChild(spec))
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
