package auditlog

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

func TestLineNamesWhatHappened(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		p    events.Payload
		want []string
		not  []string
	}{
		{"issued", events.CertIssued{Serial: "abcdef0123456789", SPIFFEID: "spiffe://td/ns/a/sa/b", NotBefore: now, NotAfter: now.Add(time.Minute), Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, Signer: "s1", AuthSource: "jwt"},
			[]string{"cert.issued", "demo-0", "spiffe://td/ns/a/sa/b", "serial=abcdef01", "expires in 1m0s"}, nil},
		{"renew scheduled", events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, Reason: events.RenewScheduled, NotAfter: now.Add(time.Hour)},
			[]string{"rotation.renew_due", "renew default", "scheduled", "cert expires in 1h0m0s"}, nil},
		// meshctl rotate pod names no certificate: no made-up expiry (was -2562047h47m16s).
		{"renew forced", events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, Reason: events.RenewForced},
			[]string{"renew default", "forced", "current cert"}, []string{"expires in", "-2562047"}},
		{"federated", events.TrustFederated{TrustDomain: "west.example", Foreign: "cluster.local", Roots: []string{"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"},
			Source: "https://127.0.0.1:8443", Sequence: 3, RefreshHint: 5 * time.Minute},
			[]string{"trust.federated", "west.example trusts cluster.local", "1 root(s) from https://127.0.0.1:8443", "sequence 3", "refresh in 5m0s"}, []string{"BEGIN CERTIFICATE"}},
		{"federation removed", events.TrustFederated{TrustDomain: "west.example", Foreign: "cluster.local", Removed: true},
			[]string{"west.example no longer trusts cluster.local"}, nil},
		{"acked", events.XDSAcked{Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, Stream: "1", TypeURL: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Version: "4"},
			[]string{"xds.acked", "default/demo-0 ACK type.googleapis.com/envoy.config.cluster.v3.Cluster version=4 (stream 1)"}, []string{"{Pod"}},
		{"pushed", events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, Resource: "ROOTCA", Version: "2", Streams: 3, Kind: "pushed"}, []string{"pushed ROOTCA", "3 stream(s)"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line := Entry{Meta: events.Meta{Type: tt.p.EventType(), Time: now}, Payload: tt.p}.Line(now)
			for _, w := range tt.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q does not contain %q", line, w)
				}
			}
			what := Describe(tt.p, now)
			for _, w := range tt.not {
				if strings.Contains(what, w) {
					t.Errorf("%q contains %q", what, w)
				}
			}
		})
	}
}

// TestReplayedHistoryIsPrintedAsItWas: an event replayed an hour later says what it
// said when it happened ("expires in 30m0s" for a 30-minute certificate), not a
// duration measured from now (issue 29 saw "expires in -7m33s").
func TestReplayedHistoryIsPrintedAsItWas(t *testing.T) {
	then := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	now := then.Add(time.Hour)
	pod := events.PodRef{Namespace: "default", Name: "demo-0"}
	for _, p := range []events.Payload{
		events.CertIssued{Serial: "abcdef0123456789", SPIFFEID: "spiffe://td/ns/a/sa/b", NotBefore: then, NotAfter: then.Add(30 * time.Minute), Pod: pod},
		events.RenewDue{Pod: pod, Reason: events.RenewScheduled, NotAfter: then.Add(30 * time.Minute)},
	} {
		line := Entry{Meta: events.Meta{Type: p.EventType(), Time: then}, Payload: p}.Line(now)
		if !strings.Contains(line, "expires in 30m0s") || strings.Contains(line, "-30m") {
			t.Errorf("replayed %s: %q", p.EventType(), line)
		}
	}
	// No time of its own: now stands in.
	p := events.CertIssued{Serial: "ab", SPIFFEID: "spiffe://td/ns/a/sa/b", NotBefore: now, NotAfter: now.Add(time.Minute), Pod: pod}
	if line := (Entry{Meta: events.Meta{Type: p.EventType()}, Payload: p}).Line(now); !strings.Contains(line, "expires in 1m0s") {
		t.Errorf("no event time: %q", line)
	}
}

// TestBenchEntries: an entry is meshctl bench's when its pod or, without one, the
// SPIFFE ID of its certificate is in events.BenchNamespace.
func TestBenchEntries(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		e    Entry
		want bool
	}{
		{"bench cert, no pod", Entry{Payload: events.CertIssued{SPIFFEID: "spiffe://td/ns/meshagent-bench/sa/load-3", NotAfter: now}}, true},
		{"bench pod", Entry{Payload: events.CertIssued{SPIFFEID: "spiffe://td/ns/x/sa/y", Pod: events.PodRef{Namespace: events.BenchNamespace, Name: "p"}}}, true},
		{"bench pod's subject", Entry{Subject: "meshagent.evt.pod.meshagent-bench.load-0.up", Payload: events.PodUp{}}, true},
		{"fleet cert", Entry{Payload: events.CertIssued{SPIFFEID: "spiffe://td/ns/default/sa/web"}}, false},
		{"a namespace that only starts alike", Entry{Payload: events.CertIssued{SPIFFEID: "spiffe://td/ns/meshagent-bench-x/sa/web"}}, false},
		{"trust change", Entry{Payload: events.TrustChanged{}}, false},
	} {
		if got := tc.e.Bench(); got != tc.want {
			t.Errorf("%s: Bench() = %v", tc.name, got)
		}
	}
	if ns := events.NamespaceOfID("spiffe://td/ns/a/sa/b/extra"); ns != "" {
		t.Errorf("a longer path: namespace %q", ns)
	}
}
