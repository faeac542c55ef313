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
