package federation

import (
	"os"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// A followed domain is refreshed when its refresh hint has passed on the
// follower's clock, and not before: the test moves a fake clock, never sleeps.
func TestRefreshIsDueOnTheFollowersClock(t *testing.T) {
	west := newDomain(t, "west.example", 0)
	roots, _ := west.current()
	path := writeBundle(t, west.td, roots) // refresh hint: a minute
	srcs, err := ParseFiles("west.example|" + path)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	fake := clock.NewFake(start)
	f, err := NewFollower(Config{Self: spiffeid.RequireTrustDomainFromString("east.example"), MinRefresh: 10 * time.Second, MaxRefresh: time.Hour}, fake)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(testkit.Background(t, f.Run))
	if err := f.Follow(srcs); err != nil {
		t.Fatal(err)
	}
	// fetched reports whether the last fetch was at, and the follower now waits on
	// its timer for the next one.
	fetched := func(at time.Time) bool {
		st := f.Status()
		return len(st) == 1 && st[0].FetchedAt.Equal(at) && fake.Timers() == 1
	}
	testkit.Eventually(t, "first fetch, at the fake clock's time", func() bool { return fetched(start) })
	if st := f.Status()[0]; !st.NextRefresh.Equal(start.Add(time.Minute)) {
		t.Fatalf("next refresh at %s, want a minute after %s", st.NextRefresh, start)
	}

	west.rotate(t)
	newRoots, _ := west.current()
	data, err := BundleOf(west.td, newRoots, 2, time.Minute).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fake.Add(time.Minute - time.Second) // not due yet: nothing runs
	if !fetched(start) {
		t.Fatalf("refreshed before its hint passed: %+v", f.Status())
	}
	if b, _ := f.Bundles().Get(west.td); b.HasX509Authority(newRoots[0]) {
		t.Fatal("new root taken before the refresh was due")
	}
	fake.Add(time.Second)
	due := start.Add(time.Minute)
	testkit.Eventually(t, "refreshed once the hint passed on the clock", func() bool {
		b, ok := f.Bundles().Get(west.td)
		return ok && b.HasX509Authority(newRoots[0]) && fetched(due)
	})
}
