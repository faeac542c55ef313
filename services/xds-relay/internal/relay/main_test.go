package relay_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind (streams,
// connections, publishers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
