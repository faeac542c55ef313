package faultcheck

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// samples is one sample a second from t0 serving a leaf that expires at notAfter,
// /readyz saying ready[i].
func samples(notAfter time.Time, ready ...int) []Sample {
	leaf := &x509.Certificate{NotAfter: notAfter}
	var out []Sample
	for i, r := range ready {
		out = append(out, Sample{At: t0.Add(time.Duration(i) * time.Second), Cur: Served{Leaf: leaf}, Up: true, Ready: r})
	}
	return out
}

// down marks samples i as taken while the SDS stream was down.
func down(s []Sample, i ...int) []Sample {
	for _, j := range i {
		s[j].Up = false
	}
	return s
}

func TestMeasureExpiry(t *testing.T) {
	exp := t0.Add(2 * time.Second) // samples 2, 3, 4 show it expired
	tests := []struct {
		name        string
		samples     []Sample
		unreachable []Window
		want        Expiry
	}{
		{"nothing expired", samples(t0.Add(time.Hour), 200, 200, 200), nil, Expiry{}},
		{"ready throughout", samples(exp, 200, 200, 200, 200, 200), nil,
			Expiry{Served: 2 * time.Second, Reachable: 2 * time.Second, ReadyLag: Never}},
		{"not ready a second after expiry", samples(exp, 200, 200, 200, 503, 503), nil,
			Expiry{Served: 2 * time.Second, Reachable: 2 * time.Second, ReadyLag: time.Second}},
		{"no signer reachable", samples(exp, 200, 200, 503, 503, 503), []Window{{t0, t0.Add(time.Hour)}},
			Expiry{Served: 2 * time.Second, ReadyLag: 0}},
		// sds-edge not running across the expiry (a docker-compose restart that took
		// longer than SECRET_TTL under load): nothing served then, and readiness is
		// judged from when it is back (here at once).
		{"sds-edge down across the expiry", down(samples(exp, 200, 0, 0, 0, 503, 503), 1, 2, 3), nil,
			Expiry{Served: time.Second, Reachable: time.Second, ReadyLag: 0}},
		{"back, then ready a second too long", down(samples(exp, 200, 0, 0, 200, 503), 1, 2), nil,
			Expiry{Served: time.Second, Reachable: time.Second, ReadyLag: time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MeasureExpiry(tc.samples, tc.unreachable); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// An event published before the stream existed crossed the bus but is not stored:
// lost. One published into the stream is not.
func TestLedgerFindsEventsMissingFromTheStream(t *testing.T) {
	nc := bustest.Conn(t, bustest.Server(t))
	l, err := NewLedger(nc)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	issued := func(serial string) {
		t.Helper()
		m, err := events.Encode(events.SubjectCertIssued, events.Meta{Source: "test", Subject: serial}, events.CertIssued{Serial: serial, SPIFFEID: "spiffe://td/ns/a/sa/b",
			Pod: events.PodRef{Namespace: "a", Name: "p-0"}, NotBefore: t0, NotAfter: t0.Add(time.Hour), KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "s", RootFingerprint: "ab"})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	issued("0a")
	js := bustest.JetStream(t, nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: events.StreamEvents, Subjects: []string{events.EventsWildcard}}); err != nil {
		t.Fatal(err)
	}
	issued("0b")
	lost, excused, err := l.SettleUnstored(start, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 1 || lost[0].Key != "0a" || len(excused) != 0 || ByKind(lost)["cert.issued"] != 1 {
		t.Fatalf("lost %v (excused %v), want the cert.issued of 0a", lost, excused)
	}
	lost, excused, _ = l.SettleUnstored(start, time.Second, func(s Seen) bool { return s.Key == "0a" })
	if len(lost) != 0 || len(excused) != 1 {
		t.Fatalf("excusing 0a: lost %v, excused %v", lost, excused)
	}
	if l.HasIssued("0a") || !l.HasIssued("0b") {
		t.Fatal("the stream's cert.issued serials are wrong")
	}
	if got := l.IssuedSince(start, events.PodRef{Namespace: "a", Name: "p-0"}); len(got) != 1 || got[0].Serial != "0b" || got[0].Signer != "s" {
		t.Fatalf("IssuedSince = %+v, want the stored 0b only", got)
	}
	if got := l.IssuedSince(start, events.PodRef{Namespace: "b", Name: "p-0"}); len(got) != 0 {
		t.Fatalf("IssuedSince of another pod = %+v", got)
	}
	if got := l.IssuedSince(time.Now().Add(time.Minute), events.PodRef{Namespace: "a", Name: "p-0"}); len(got) != 0 {
		t.Fatalf("IssuedSince a later time = %+v", got)
	}
	if got := Diff(map[string]int{}, l.Counts()); got != "cert.issued +1" {
		t.Fatalf("Diff = %q", got)
	}
	if err := l.Recheck(); err != nil {
		t.Fatalf("recheck of an intact stream: %v", err)
	}
	st, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Recheck(); err == nil {
		t.Fatal("recheck of a purged stream found nothing missing")
	}
}

// TestLedgerAsksTheLeader: a sequence a (lagging) replica answered "not found" for
// is read from the stream's leader, which has it — headers, subject and data as
// stored — and one the leader does not hold (deleted) is reported as such.
func TestLedgerAsksTheLeader(t *testing.T) {
	nc := bustest.Conn(t, bustest.Server(t))
	l, err := NewLedger(nc)
	if err != nil {
		t.Fatal(err)
	}
	js := bustest.JetStream(t, nc)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: events.StreamEvents, Subjects: []string{events.EventsWildcard}, AllowDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, serial := range []string{"0a", "0b"} {
		m, err := events.Encode(events.SubjectCertIssued, events.Meta{Source: "test", Subject: serial}, events.CertIssued{Serial: serial, SPIFFEID: "spiffe://td/ns/a/sa/b",
			Pod: events.PodRef{Namespace: "a", Name: "p-0"}, NotBefore: t0, NotAfter: t0.Add(time.Hour), KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "s", RootFingerprint: "ab"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.Header.Get(events.HeaderID))
	}
	if err := st.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, found, err := l.fromLeader(ctx, events.StreamEvents, 1); err != nil || found {
		t.Fatalf("deleted message 1: found %v, %v", found, err)
	}
	m, found, err := l.fromLeader(ctx, events.StreamEvents, 2)
	if err != nil || !found {
		t.Fatalf("message 2: found %v, %v", found, err)
	}
	if m.Subject != events.SubjectCertIssued || m.Sequence != 2 || m.Header.Get(events.HeaderID) != ids[1] {
		t.Fatalf("message 2 from the leader: %s seq %d id %q, want id %q", m.Subject, m.Sequence, m.Header.Get(events.HeaderID), ids[1])
	}
	e, _, err := events.Decode[events.CertIssued](&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err != nil || e.Serial != "0b" {
		t.Fatalf("decode the leader's copy: %+v, %v", e, err)
	}
}
