package identity

import (
	"crypto/x509"
	"math/big"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

func TestStaleRenew(t *testing.T) {
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(0x1234), NotBefore: now, NotAfter: now.Add(24 * time.Hour)}
	cur := pki.SerialHex(leaf)
	tests := []struct {
		name      string
		noLeaf    bool
		r         events.RenewDue
		wantStale bool
	}{
		{name: "current serial", r: events.RenewDue{Serial: cur, NotAfter: leaf.NotAfter}},
		{name: "no serial", r: events.RenewDue{}},
		{name: "older certificate", r: events.RenewDue{Serial: "0abc", NotAfter: leaf.NotAfter.Add(-time.Hour)}, wantStale: true},
		{name: "other serial, same NotAfter", r: events.RenewDue{Serial: "0abc", NotAfter: leaf.NotAfter}, wantStale: true},
		{name: "other serial, no NotAfter", r: events.RenewDue{Serial: "0abc"}, wantStale: true},
		{name: "newer certificate the pod never got", r: events.RenewDue{Serial: "0abc", NotAfter: leaf.NotAfter.Add(time.Second)}},
		{name: "before the first certificate", noLeaf: true, r: events.RenewDue{Serial: "0abc"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{}, nil, nil, nil, clock.NewFake(now), hclog.NewNullLogger())
			if !tc.noLeaf {
				m.chain = []*x509.Certificate{leaf}
			}
			if _, stale := m.stale(tc.r); stale != tc.wantStale {
				t.Fatalf("stale = %v, want %v", stale, tc.wantStale)
			}
			// Renew queues exactly the renew-dues that are not stale.
			m.Renew(tc.r)
			if queued := len(m.renew) == 1; queued == tc.wantStale {
				t.Fatalf("queued = %v for stale = %v", queued, tc.wantStale)
			}
		})
	}
}

// Istio's CA backdates NotBefore by two minutes (ClockSkewGracePeriod): a
// certificate asked for 30 s lives 2m30s by its dates. The renewals count from
// when the reply came, as Istio's agent does, so such a certificate is not due the
// moment it arrives (it would be renewed every second); a certificate restored
// after a restart (no reply time) counts from its NotBefore.
func TestRenewalsCountFromTheReplyNotABackdatedNotBefore(t *testing.T) {
	got := time.Date(2026, 12, 7, 17, 0, 0, 0, time.UTC)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: got.Add(-2 * time.Minute), NotAfter: got.Add(30 * time.Second)}
	tests := []struct {
		name          string
		got           time.Time
		deadline, due time.Time
	}{
		{"from a sign reply", got, got.Add(24 * time.Second), got.Add(15 * time.Second)},
		{"restored", time.Time{}, leaf.NotBefore.Add(120 * time.Second), leaf.NotBefore.Add(75 * time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{SafetyRatio: 0.8, GraceRatio: 0.5}, nil, nil, nil, clock.NewFake(got), hclog.NewNullLogger())
			m.chain, m.got = []*x509.Certificate{leaf}, tc.got
			if d := m.deadline(); !d.Equal(tc.deadline) {
				t.Errorf("safety deadline %s, want %s", d, tc.deadline)
			}
			if d, ok := m.renewDue(); !ok || !d.Equal(tc.due) {
				t.Errorf("renew due %s, want %s", d, tc.due)
			}
		})
	}
}
