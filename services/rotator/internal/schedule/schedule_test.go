package schedule

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func cert(pod, serial string, nb time.Time, life time.Duration) Cert {
	return Cert{Pod: pod, Serial: serial, Root: "root-a", NotBefore: nb, NotAfter: nb.Add(life)}
}

func cfg() Config {
	return Config{GraceRatio: 0.5, Jitter: 0, RetryAfter: time.Minute, RetryMax: 8 * time.Minute}
}

func TestJitterBounds(t *testing.T) {
	tests := []struct {
		name          string
		ratio, jitter float64
	}{
		{"istio default", 0.5, 0.01},
		{"no jitter", 0.5, 0},
		{"wide", 0.5, 0.2},
		{"small ratio", 0.1, 0.05},
		{"clamped high", 0.95, 0.1},
		{"clamped low", 0.02, 0.1},
	}
	const life = 24 * time.Hour
	const samples = 20000
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{GraceRatio: tc.ratio, Jitter: tc.jitter}
			lo := t0.Add(time.Duration((1 - min(1, tc.ratio+tc.jitter)) * float64(life)))
			hi := t0.Add(time.Duration((1 - max(0, tc.ratio-tc.jitter)) * float64(life)))
			mid := t0.Add(time.Duration((1 - tc.ratio) * float64(life)))
			var below, above int
			first, last := hi, lo
			for i := range samples {
				at := RenewAt(c, cert(fmt.Sprintf("pod-%d", i), fmt.Sprintf("%x", rand.Uint64()), t0, life))
				if at.Before(lo) || at.After(hi) {
					t.Fatalf("sample %d: renew at %v outside [%v, %v]", i, at, lo, hi)
				}
				if at.Before(mid) {
					below++
				}
				if at.After(mid) {
					above++
				}
				first, last = minTime(first, at), maxTime(last, at)
			}
			if tc.jitter == 0 {
				if !first.Equal(mid) || !last.Equal(mid) {
					t.Fatalf("no jitter: got [%v, %v], want %v", first, last, mid)
				}
				return
			}
			// Both signs, as Istio; and the samples fill the allowed range.
			if tc.ratio+tc.jitter <= 1 && tc.ratio-tc.jitter >= 0 && (below < samples/3 || above < samples/3) {
				t.Fatalf("jitter not symmetric: %d below, %d above the mid point", below, above)
			}
			if span, want := last.Sub(first), hi.Sub(lo); span < want*9/10 {
				t.Fatalf("samples span %v of the allowed %v", span, want)
			}
		})
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func TestRenewAtIsDeterministic(t *testing.T) {
	c := Config{GraceRatio: 0.5, Jitter: 0.3}
	x := cert("web-0", "abc", t0, time.Hour)
	if a, b := RenewAt(c, x), RenewAt(c, x); !a.Equal(b) {
		t.Fatalf("same cert, two times: %v %v", a, b)
	}
}

func TestReplacement(t *testing.T) {
	const life = time.Hour
	base := cert("web-0", "0a", t0, life)
	base.Issued = t0.Add(100 * time.Millisecond)
	// Renewed within the same second: same notBefore and notAfter (X.509 has whole
	// seconds); the serials are random, so only the issuance time tells which is newer.
	sameSecond := func(serial string, issued time.Duration) Cert {
		c := cert("web-0", serial, t0, life)
		c.Issued = t0.Add(issued)
		return c
	}
	tests := []struct {
		name       string
		next       Cert
		want       Result
		wantSerial string
	}{
		{"newer notBefore replaces", cert("web-0", "0b", t0.Add(time.Minute), life), Replaced, "0b"},
		{"older notBefore does not", cert("web-0", "09", t0.Add(-time.Minute), life), Stale, "0a"},
		{"same cert is a duplicate", base, Duplicate, "0a"},
		{"same notBefore, later notAfter replaces", cert("web-0", "0c", t0, 2*life), Replaced, "0c"},
		{"same second, issued later, smaller serial replaces", sameSecond("01", 900*time.Millisecond), Replaced, "01"},
		{"same second, issued earlier, larger serial does not", sameSecond("ff", 50*time.Millisecond), Stale, "0a"},
		{"same serial issued again is a duplicate", sameSecond("0a", 900*time.Millisecond), Duplicate, "0a"},
		{"other resource is a new entry", Cert{Pod: "web-0", Resource: "file-cert", Serial: "0d", Root: "r", NotBefore: t0, NotAfter: t0.Add(life)}, Added, "0a"},
		{"other pod is a new entry", cert("web-1", "0e", t0, life), Added, "0a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := New(cfg())
			if r, err := s.Upsert(base, t0); err != nil || r != Added {
				t.Fatalf("first upsert: %v %v", r, err)
			}
			r, err := s.Upsert(tc.next, t0)
			if err != nil || r != tc.want {
				t.Fatalf("got %v %v, want %v", r, err, tc.want)
			}
			rec, _ := s.Record("web-0", "")
			if rec.Serial != tc.wantSerial {
				t.Fatalf("entry holds serial %s, want %s", rec.Serial, tc.wantSerial)
			}
			// The schedule fires exactly for what it holds.
			n := s.Len()
			got := s.Take(t0.Add(61*time.Minute), 10)
			if len(got) != n {
				t.Fatalf("took %d renewals for %d entries", len(got), n)
			}
		})
	}
}

func TestRejectsBadCert(t *testing.T) {
	s := New(cfg())
	for _, c := range []Cert{{Serial: "1", NotBefore: t0, NotAfter: t0.Add(time.Hour)}, cert("p", "", t0, time.Hour), cert("p", "1", t0, -time.Hour)} {
		if _, err := s.Upsert(c, t0); err == nil {
			t.Fatalf("accepted %+v", c)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("bad certs changed the schedule: %d entries", s.Len())
	}
}

func TestRetirePod(t *testing.T) {
	s := New(cfg())
	for i, c := range []Cert{
		cert("web-0", "1", t0, time.Hour),
		{Pod: "web-0", Resource: "file-cert", Serial: "2", Root: "r", NotBefore: t0, NotAfter: t0.Add(time.Hour)},
		cert("web-1", "3", t0, time.Hour),
		cert("web-2", "4", t0, time.Hour),
	} {
		if _, err := s.Upsert(c, t0); err != nil {
			t.Fatal(i, err)
		}
	}
	if got := s.RetirePod("web-0"); len(got) != 2 {
		t.Fatalf("retired %v, want default and file-cert", got)
	}
	if got := s.RetirePod("nobody"); len(got) != 0 {
		t.Fatalf("retired %v of an unknown pod", got)
	}
	if s.Len() != 2 {
		t.Fatalf("%d entries left, want 2", s.Len())
	}
	got := s.Take(t0.Add(time.Hour-time.Second), 10)
	pods := map[string]bool{}
	for _, r := range got {
		pods[r.Pod] = true
	}
	if len(got) != 2 || !pods["web-1"] || !pods["web-2"] {
		t.Fatalf("renewals after retirement: %+v", got)
	}
}

func TestRateLimitMostUrgentFirst(t *testing.T) {
	c := cfg()
	c.Rate, c.Burst = 10, 1
	s := New(c)
	// 50 entries, all due by t0+1h, with different expiries in scrambled order.
	perm := rand.Perm(50)
	for i, p := range perm {
		life := time.Duration(2+p) * time.Hour
		nb := t0.Add(-life / 2)
		if _, err := s.Upsert(cert(fmt.Sprintf("pod-%d", i), fmt.Sprint(i), nb, life), t0); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(time.Hour)
	var sent []Renewal
	for steps := 0; len(sent) < 50 && steps < 1000; steps++ {
		sent = append(sent, s.Take(now, 100)...)
		if len(sent) >= 50 {
			break
		}
		next, ok := s.NextWake(now)
		if !ok {
			break
		}
		now = maxTime(now, next)
	}
	if len(sent) != 50 {
		t.Fatalf("sent %d of 50", len(sent))
	}
	for i := 1; i < len(sent); i++ {
		if sent[i].NotAfter.Before(sent[i-1].NotAfter) {
			t.Fatalf("renewal %d expires %v before renewal %d (%v): not most urgent first", i, sent[i].NotAfter, i-1, sent[i-1].NotAfter)
		}
	}
	// 50 at 10/s with a burst of 1 take 4.9 s.
	if d := now.Sub(t0.Add(time.Hour)); d < 4800*time.Millisecond || d > 5*time.Second {
		t.Fatalf("50 renewals at 10/s took %v", d)
	}
	if !sent[49].RateLimited || sent[0].RateLimited {
		t.Fatalf("rate-limited marks: first %v, last %v", sent[0].RateLimited, sent[49].RateLimited)
	}
}

func TestRetryWithBackoffUntilReplaced(t *testing.T) {
	s := New(cfg()) // retry after 1m, doubling, capped at 8m
	if _, err := s.Upsert(cert("web-0", "1", t0, 10*time.Hour), t0); err != nil {
		t.Fatal(err)
	}
	due := t0.Add(5 * time.Hour)
	if got := s.Take(due.Add(-time.Second), 10); len(got) != 0 {
		t.Fatalf("sent before due: %+v", got)
	}
	wants := []struct {
		after   time.Duration
		attempt int
		reason  string
	}{{0, 1, events.RenewScheduled}, {time.Minute, 2, events.RenewRetry}, {2 * time.Minute, 3, events.RenewRetry}, {4 * time.Minute, 4, events.RenewRetry}, {8 * time.Minute, 5, events.RenewRetry}, {8 * time.Minute, 6, events.RenewRetry}}
	now := due
	for i, w := range wants {
		now = now.Add(w.after)
		if got := s.Take(now.Add(-time.Nanosecond), 10); len(got) != 0 && i > 0 {
			t.Fatalf("attempt %d sent early", w.attempt)
		}
		got := s.Take(now, 10)
		if len(got) != 1 || got[0].Attempt != w.attempt || got[0].Reason != w.reason {
			t.Fatalf("step %d: got %+v, want attempt %d reason %s", i, got, w.attempt, w.reason)
		}
	}
	if st := s.Stats(); st.Overdue != 1 {
		t.Fatalf("overdue = %d, want 1", st.Overdue)
	}
	// The new certificate ends the retries.
	if r, _ := s.Upsert(cert("web-0", "2", now, 10*time.Hour), now); r != Replaced {
		t.Fatalf("new cert: %v", r)
	}
	if st := s.Stats(); st.Overdue != 0 {
		t.Fatalf("overdue after replacement = %d", st.Overdue)
	}
	if got := s.Take(now.Add(time.Hour), 10); len(got) != 0 {
		t.Fatalf("retry after replacement: %+v", got)
	}
}

func TestRetiredWhenExpired(t *testing.T) {
	s := New(cfg())
	if _, err := s.Upsert(cert("web-0", "1", t0, 10*time.Minute), t0); err != nil {
		t.Fatal(err)
	}
	got := s.Take(t0.Add(11*time.Minute), 10)
	if len(got) != 1 || !got[0].Retired || s.Len() != 0 || s.Stats().Expired != 1 {
		t.Fatalf("expired entry: %+v, %d left", got, s.Len())
	}
}

func TestRootRotationRenewsOldRootLeavesOnly(t *testing.T) {
	s := New(cfg())
	s.ChangeTrust("root-a", nil, 1, t0)
	for i := range 10 {
		c := cert(fmt.Sprintf("old-%d", i), fmt.Sprint(i), t0, time.Duration(10+i)*time.Hour)
		if _, err := s.Upsert(c, t0); err != nil {
			t.Fatal(err)
		}
	}
	fresh := cert("new-0", "99", t0, time.Hour)
	fresh.Root = "root-b"
	if _, err := s.Upsert(fresh, t0); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Minute)
	if n, changed := s.ChangeTrust("root-a", nil, 1, now); n != 0 || changed {
		t.Fatalf("same root: marked %d", n)
	}
	if n, changed := s.ChangeTrust("root-b", []string{"root-a"}, 2, now); n != 10 || !changed {
		t.Fatalf("marked %d, changed %v; want 10 old-root leaves", n, changed)
	}
	if n, _ := s.ChangeTrust("root-a", nil, 1, now); n != 0 || s.Trust().Current != "root-b" {
		t.Fatal("a stale generation changed the trust view")
	}
	got := s.Take(now, 100)
	if len(got) != 10 {
		t.Fatalf("took %d, want the 10 old-root leaves", len(got))
	}
	for i, r := range got {
		if r.Reason != events.RenewRootRotation || r.Pod != fmt.Sprintf("old-%d", i) {
			t.Fatalf("renewal %d: %+v (want old-%d, most urgent first)", i, r, i)
		}
	}
	// A late leaf under the old root is renewed at once too.
	late := cert("late-0", "77", now, time.Hour)
	if _, err := s.Upsert(late, now); err != nil {
		t.Fatal(err)
	}
	if got := s.Take(now, 10); len(got) != 1 || got[0].Reason != events.RenewRootRotation {
		t.Fatalf("late old-root leaf: %+v", got)
	}
}

func TestRecordRestoreKeepsSentState(t *testing.T) {
	s := New(cfg())
	for i := range 4 {
		if _, err := s.Upsert(cert(fmt.Sprintf("p-%d", i), fmt.Sprint(i), t0, time.Duration(i+2)*time.Hour), t0); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(100 * time.Minute) // p-0 (due 1h) and p-1 (1h30) due
	if got := s.Take(now, 10); len(got) != 2 {
		t.Fatalf("took %d", len(got))
	}
	r2 := New(cfg())
	for i := range 4 {
		rec, ok := s.Record(fmt.Sprintf("p-%d", i), "default")
		if !ok {
			t.Fatal("missing record")
		}
		if _, err := r2.Restore(rec, now); err != nil {
			t.Fatal(err)
		}
	}
	later := now.Add(30 * time.Minute) // p-2 (due 2h) and the retries of p-0 and p-1; not p-3 (2h30)
	got := r2.Take(later, 10)
	reasons := map[string]string{}
	for _, r := range got {
		reasons[r.Pod] = r.Reason
	}
	want := map[string]string{"p-0": events.RenewRetry, "p-1": events.RenewRetry, "p-2": events.RenewScheduled}
	if fmt.Sprint(reasons) != fmt.Sprint(want) {
		t.Fatalf("after restore: %v, want %v", reasons, want)
	}
}

// A pod.down applied after the cert.issued of the pod that replaced it (same name,
// read from another stream) retires only the certificates issued before it.
func TestRetirePodBefore(t *testing.T) {
	s := New(cfg())
	old := cert("web-0", "1", t0, time.Hour)
	old.Issued = t0.Add(time.Second)
	if _, err := s.Upsert(old, t0); err != nil {
		t.Fatal(err)
	}
	down := t0.Add(time.Minute)
	if got := s.RetirePodBefore("web-0", down); len(got) != 1 {
		t.Fatalf("retired %v, want the certificate issued before the pod went down", got)
	}
	newer := cert("web-0", "2", t0.Add(2*time.Minute), time.Hour)
	newer.Issued = t0.Add(2 * time.Minute)
	if _, err := s.Upsert(newer, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := s.RetirePodBefore("web-0", down); len(got) != 0 || s.Len() != 1 {
		t.Fatalf("a late pod.down retired %v of the newer pod's certificate (%d left)", got, s.Len())
	}
	// A pod.down stored after that certificate retires it.
	if got := s.RetirePodBefore("web-0", t0.Add(3*time.Minute)); len(got) != 1 || s.Len() != 0 {
		t.Fatalf("retired %v, %d left", got, s.Len())
	}
}
