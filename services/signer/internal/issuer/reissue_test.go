package issuer

import (
	"testing"
	"time"
)

// The bound counts per holder in a sliding window: the limit-th certificate within
// ReissueWindow stops the next one until the oldest of them leaves the window.
func TestReissuesSlidingWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	r := &reissues{limit: 2}
	r.issued("a", t0)
	r.issued("a", t0.Add(10*time.Second))
	if ok, n, next := r.allow("a", t0.Add(20*time.Second)); ok || n != 2 || !next.Equal(t0.Add(ReissueWindow)) {
		t.Fatalf("third in the window: ok %t, %d, next %s", ok, n, next)
	}
	if ok, _, _ := r.allow("b", t0.Add(20*time.Second)); !ok {
		t.Fatal("another holder refused")
	}
	if ok, n, _ := r.allow("a", t0.Add(ReissueWindow+time.Second)); !ok || n != 1 {
		t.Fatalf("after the oldest left the window: ok %t, %d", ok, n)
	}
	if ok, _, _ := (&reissues{}).allow("a", t0); !ok {
		t.Fatal("no limit refused")
	}
}
