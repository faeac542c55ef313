package renewal

import (
	"context"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestForgedRecordsAreRejected: a cert.issued that does not verify against its
// own chain and the trust bundle is terminated, counted with its reason, and
// reaches neither the schedule nor the bucket.
func TestForgedRecordsAreRejected(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	h.issue("web-0", "01", now, time.Hour, "root-a")
	waitScheduled(t, r, 1)

	evil := newTestCA(t)
	evil.root("root-a") // same name, another key: what a forger can make
	id := "spiffe://cluster.local/ns/default/sa/web-1"
	tests := []struct {
		name   string
		reason string
		ev     func() events.CertIssued
	}{
		{"missing chain", reasonNoChain, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			ev.CertChain = nil
			return ev
		}},
		{"garbled chain", reasonBadChain, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			ev.CertChain = []string{"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}
			return ev
		}},
		{"self-signed leaf", reasonUntrusted, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			ev.CertChain = pki.CertPEMs([]*x509.Certificate{testkit.SelfSigned(t, leafSpec(t, id, "02", now, time.Hour)).Cert})
			return ev
		}},
		{"leaf under another root", reasonUntrusted, func() events.CertIssued {
			ev := evil.record(t, "web-1", "02", now, time.Hour, "root-a")
			_, ev.RootFingerprint = h.ca.root("root-a") // and claiming the genuine one
			return ev
		}},
		{"serial differs", reasonMismatch, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			ev.Serial = "03"
			return ev
		}},
		{"expiry differs", reasonMismatch, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			ev.NotAfter = ev.NotAfter.Add(24 * time.Hour) // renewal put off a day
			return ev
		}},
		{"spiffe id differs", reasonMismatch, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			ev.SPIFFEID = "spiffe://cluster.local/ns/default/sa/web-2"
			return ev
		}},
		{"root fingerprint differs", reasonMismatch, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			_, ev.RootFingerprint = h.ca.root("root-z")
			return ev
		}},
		{"another pod's certificate", reasonMismatch, func() events.CertIssued {
			ev := h.ca.record(t, "web-1", "02", now, time.Hour, "root-a")
			ev.Pod = dpod("web-0") // a genuine chain, replayed for the pod already scheduled
			ev.SPIFFEID = "spiffe://cluster.local/ns/default/sa/web-0"
			return ev
		}},
	}
	ctx := context.Background()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h.publish(events.SubjectCertIssued, tc.ev())
			testkit.Eventually(t, "rejection counted", func() bool { return counter(t, r.m.events.WithLabelValues("cert.issued", "rejected")) == float64(i+1) })
			if got := counter(t, r.m.certRejected.WithLabelValues(tc.reason)); got == 0 {
				t.Fatalf("not counted as %s", tc.reason)
			}
			if st, _ := r.Stats(); st.Scheduled != 1 {
				t.Fatalf("schedule changed: %d entries", st.Scheduled)
			}
			for _, pod := range []string{"web-0", "web-1"} {
				rec, ok, err := r.store.Get(ctx, "default/"+pod, "default")
				if err != nil {
					t.Fatal(err)
				}
				if pod == "web-1" && ok || pod == "web-0" && (!ok || rec.Serial != "01") {
					t.Fatalf("bucket changed: %s %v %+v", pod, ok, rec)
				}
			}
		})
	}
	// And the consumer carries on with genuine records.
	h.issue("web-1", "02", now, time.Hour, "root-a")
	waitScheduled(t, r, 2)
}

// A record under a new root can come before the trust.changed announcing it: the
// rotator asks for the bundle and accepts it. A forged trust.changed changes nothing.
func TestRecordUnderNewRootBeforeTrustChanged(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	testkit.Eventually(t, "bundle trusted on first use", func() bool { return r.trust.Bootstrapped() })
	if r.trust.Mode() != "first-use" || counter(t, r.m.trustBootstrap.WithLabelValues("first-use")) != 1 {
		t.Fatal("first-use bootstrap not reported")
	}
	_, fpNew := h.ca.root("root-new") // the signer rotated; its trust.changed is late
	if r.trust.Has(fpNew) {
		t.Fatal("new root known before anyone said so")
	}
	h.issue("web-0", "01", now, time.Hour, "root-new")
	waitScheduled(t, r, 1)
	if rec, _ := r.Record("default/web-0", "default"); rec.Root != fpNew {
		t.Fatalf("scheduled under root %.16s", rec.Root)
	}

	// trust.changed forged: unendorsed, or endorsed by the forger's own root.
	evil := newTestCA(t)
	evil.root("evil")
	for i, ev := range []events.TrustChanged{
		func() events.TrustChanged { ev := evil.trustChanged(t, 99, "evil"); ev.Endorsements = nil; return ev }(),
		evil.trustChanged(t, 100, "evil"),
	} {
		h.publish(events.SubjectTrustChanged, ev)
		testkit.Eventually(t, "forgery rejected", func() bool {
			return counter(t, r.m.events.WithLabelValues("trust.changed", "rejected")) == float64(i+1)
		})
	}
	if tr := r.sched.Trust(); tr.Current != "" {
		t.Fatalf("trust view changed by a forgery: %+v", tr)
	}
	_, fpEvil := evil.root("evil")
	if r.trust.Has(fpEvil) {
		t.Fatal("forged root trusted")
	}
	// A record under the forger's root stays rejected, even after a refresh.
	h.publish(events.SubjectCertIssued, evil.record(t, "web-1", "02", now, time.Hour, "evil"))
	testkit.Eventually(t, "record rejected", func() bool { return counter(t, r.m.certRejected.WithLabelValues(reasonUntrusted)) == 1 })
	// The genuine trust.changed, late, applies.
	h.publish(events.SubjectTrustChanged, h.ca.trustChanged(t, 2, "root-new", "root-a"))
	testkit.Eventually(t, "trust applied", func() bool {
		r.mu.Lock() // the schedule is the leader's, guarded by mu
		defer r.mu.Unlock()
		return r.sched.Trust().Current == fpNew
	})
	if st, _ := r.Stats(); st.Scheduled != 1 {
		t.Fatalf("%d scheduled, want 1", st.Scheduled)
	}
}

// A bundle request answered by a forger (endorsed by its own key) is refused:
// a record under its root is rejected.
func TestForgedBundleReplyIsRefused(t *testing.T) {
	h, r := newLeader(t)
	testkit.Eventually(t, "bundle trusted", func() bool { return r.trust.Bootstrapped() })
	evil := newTestCA(t)
	evil.root("evil")
	evil.serveBundle(t, h.nc) // answers too; which reply comes first is a race
	for i := range 5 {
		h.publish(events.SubjectCertIssued, evil.record(t, fmt.Sprintf("web-%d", i), fmt.Sprint(i+1), h.clk.Now(), time.Hour, "evil"))
	}
	testkit.Eventually(t, "records rejected", func() bool { return counter(t, r.m.certRejected.WithLabelValues(reasonUntrusted)) == 5 })
	if _, fp := evil.root("evil"); r.trust.Has(fp) {
		t.Fatal("forged root trusted")
	}
	if st, _ := r.Stats(); st.Scheduled != 0 {
		t.Fatalf("%d scheduled", st.Scheduled)
	}
}
