package ca

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind (KV watches,
// directory watchers).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
