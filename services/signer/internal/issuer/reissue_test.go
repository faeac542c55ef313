package issuer

import (
	"fmt"
	"testing"
	"time"
)

// Only early certificates count (the one before less than a quarter through its
// life): a pod on 6 s certificates renewing at half their life is never refused,
// however many it gets a minute; one asking again at once is refused once it had
// the limit of early ones in the window, until the oldest of them leaves it.
func TestReissuesCountOnlyEarlyCertificates(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	r := &reissues{limit: 2}
	for i := range 40 { // 2 minutes of renewals at half of a 6 s life
		at := t0.Add(time.Duration(i) * 3 * time.Second)
		if ok, _, _ := r.allow("vm", at); !ok {
			t.Fatalf("a renewal on schedule refused at %s", at.Sub(t0))
		}
		r.issued("vm", at, 6*time.Second)
	}
	life := time.Hour
	r.issued("a", t0, life)                     // the first: not early
	r.issued("a", t0.Add(5*time.Second), life)  // early
	r.issued("a", t0.Add(10*time.Second), life) // early
	if ok, n, next := r.allow("a", t0.Add(20*time.Second)); ok || n != 2 || !next.Equal(t0.Add(5*time.Second+ReissueWindow)) {
		t.Fatalf("after 2 early: ok %t, %d, next %s", ok, n, next)
	}
	if ok, _, _ := r.allow("b", t0.Add(20*time.Second)); !ok {
		t.Fatal("another holder refused")
	}
	if ok, n, _ := r.allow("a", t0.Add(5*time.Second+ReissueWindow+time.Second)); !ok || n != 1 {
		t.Fatalf("after the oldest early one left the window: ok %t, %d", ok, n)
	}
	if ok, _, _ := (&reissues{}).allow("a", t0); !ok {
		t.Fatal("no limit refused")
	}
}

// Holders with nothing recent are forgotten, and forgetting them is paid for once
// per doubling of the holders, not on every certificate: 40,000 pods with hour-long
// certificates (all still recent) sweep the map a few times, not 36,000 times; once
// their certificates have lived, the next sweep forgets them.
func TestReissuesSweepOncePerDoubling(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	r := &reissues{limit: 2}
	const pods = 40000
	for i := range pods {
		r.issued(fmt.Sprintf("storm/pod-%d", i), t0.Add(time.Duration(i)*time.Millisecond), time.Hour)
	}
	if len(r.seen) != pods {
		t.Fatalf("%d holders remembered, want %d (all still recent)", len(r.seen), pods)
	}
	if r.sweeps > 5 { // 4,096 → 8,194 → 16,390 → 32,782: 4 sweeps
		t.Fatalf("%d sweeps for %d holders: sweeping is not amortised", r.sweeps, pods)
	}
	later := t0.Add(2 * time.Hour)
	for i := range 2*len(r.seen) - pods + 2 {
		r.issued(fmt.Sprintf("next/pod-%d", i), later, time.Hour)
	}
	if _, ok := r.seen["storm/pod-0"]; ok {
		t.Fatal("a holder whose certificate has lived is still remembered after a sweep")
	}
	if len(r.seen) > 2*minSweep+pods {
		t.Fatalf("%d holders remembered", len(r.seen))
	}
}

// BenchmarkReissuesStorm is the reissue limit's bookkeeping in a storm: pods
// distinct holders (STORM_PODS-like sizes 1,000, 10,000 and 100,000), each issued
// one hour-long certificate, in one signer; it reports the bookkeeping's µs per pod
// (before the sweep was amortised, 10,000 pods cost ~O(N) each).
func BenchmarkReissuesStorm(b *testing.B) {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	for _, pods := range []int{1000, 10000, 100000} {
		holders := make([]string, pods)
		for i := range holders {
			holders[i] = fmt.Sprintf("storm/storm-%d", i)
		}
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			for range b.N {
				r := &reissues{limit: 5}
				for i, h := range holders {
					at := t0.Add(time.Duration(i) * time.Millisecond)
					r.allow(h, at)
					r.issued(h, at, time.Hour)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*pods), "µs/pod")
		})
	}
}
