package testkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

func TestBackgroundStopsOnceAndReportsWhatRunReturned(t *testing.T) {
	var runs atomic.Int32
	stop := Background(t, func(ctx context.Context) error {
		runs.Add(1)
		<-ctx.Done()
		return nil
	})
	Eventually(t, "run started", func() bool { return runs.Load() == 1 })
	stop()
	stop()

	r := &errRecorder{TB: t}
	Background(r, func(ctx context.Context) error { <-ctx.Done(); return errors.New("boom") })()
	if !strings.Contains(r.failed, "boom") {
		t.Fatalf("a failing run was not reported: %q", r.failed)
	}
}

// errRecorder records an Errorf instead of failing the test.
type errRecorder struct {
	testing.TB
	failed string
}

func (r *errRecorder) Helper() {}

func (r *errRecorder) Errorf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }
