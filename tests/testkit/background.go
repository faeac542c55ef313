package testkit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Background runs run (a service's Run, say) in a goroutine until the returned
// stop is called or the test ends. stop cancels run's context, waits for it to
// return, and fails the test if it returned an error (a Run returns nil when
// cancelled) or did not return within Timeout. Calling stop again does nothing.
func Background(t testing.TB, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run returned %v when cancelled, want nil", err)
				}
			case <-time.After(Timeout):
				t.Errorf("run did not return within %s of being cancelled", Timeout)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
