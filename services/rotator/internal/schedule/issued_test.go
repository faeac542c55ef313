package schedule

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
)

// backdate is how far the signer sets notBefore before issuance.
const backdate = 10 * time.Second

// issuedAt is a certificate issued at t for ttl, its notBefore backdated as the
// signer does.
func issuedAt(pod, serial string, t time.Time, ttl time.Duration) Cert {
	return Cert{Pod: pod, Serial: serial, Root: "root-a", NotBefore: t.Add(-backdate), NotAfter: t.Add(ttl), Issued: t}
}

func TestRenewAtCountsFromIssuance(t *testing.T) {
	const ttl = 30 * time.Second
	c := issuedAt("web-0", "0a", t0, ttl)
	tests := []struct {
		name   string
		issued time.Time
		want   time.Time
	}{
		// Istio's agent renews a 30 s certificate 15 s after it got it (ratio 0.5).
		{"from issuance", t0, t0.Add(15 * time.Second)},
		// Unknown issuance (an older event, a record written before it was kept):
		// from the backdated notBefore, 10 s after issuance.
		{"unknown: from notBefore", time.Time{}, t0.Add(10 * time.Second)},
		{"after notAfter: ignored", c.NotAfter.Add(time.Second), t0.Add(10 * time.Second)},
		{"before notBefore: ignored", c.NotBefore.Add(-time.Second), t0.Add(10 * time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := c
			c.Issued = tc.issued
			if got := RenewAt(cfg(), c); !got.Equal(tc.want) {
				t.Fatalf("RenewAt = %s after issuance, want %s", got.Sub(t0), tc.want.Sub(t0))
			}
		})
	}
}

// The schedule hands out the renewal when the clock reaches issuance + half the
// lifetime left, not before, and a record restored by another replica (or after a
// restart) keeps that time.
func TestScheduleRenewsHalfwayFromIssuance(t *testing.T) {
	const ttl = 30 * time.Second
	clk := clock.NewFake(t0)
	s := New(cfg())
	c := issuedAt("web-0", "0a", clk.Now(), ttl)
	if _, err := s.Upsert(c, clk.Now()); err != nil {
		t.Fatal(err)
	}

	restored := New(cfg())
	rec, ok := s.Record("web-0", "")
	if !ok || rec.Issued != t0.UnixNano() {
		t.Fatalf("record %+v does not keep the issuance time", rec)
	}
	if _, err := restored.Restore(rec, clk.Now()); err != nil {
		t.Fatal(err)
	}

	for name, sched := range map[string]*Schedule{"upserted": s, "restored": restored} {
		clk.Set(t0)
		if at, ok := sched.NextWake(clk.Now()); !ok || !at.Equal(t0.Add(15*time.Second)) {
			t.Fatalf("%s: next wake %v (%v), want issuance + 15s", name, at.Sub(t0), ok)
		}
		clk.Add(15*time.Second - time.Millisecond)
		if got := sched.Take(clk.Now(), 10); len(got) != 0 {
			t.Fatalf("%s: renewal handed out %s after issuance: %+v", name, clk.Now().Sub(t0), got)
		}
		clk.Add(time.Millisecond)
		got := sched.Take(clk.Now(), 10)
		if len(got) != 1 || got[0].Serial != "0a" || !got[0].Due.Equal(t0.Add(15*time.Second)) {
			t.Fatalf("%s: at issuance + 15s got %+v, want the renewal of 0a due then", name, got)
		}
	}
}
