package auditlog_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

func issue(t *testing.T, signer *nats.Conn, pod string) {
	t.Helper()
	now := time.Now()
	msg, err := events.NewMsg(events.SubjectCertIssued, "signer-0", events.CertIssued{Serial: events.NewID(), SPIFFEID: "spiffe://td/ns/a/sa/" + pod,
		NotBefore: now, NotAfter: now.Add(time.Hour), Pod: events.PodRef{Namespace: "default", Name: pod}, KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "r"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bus.Publish(ctx, bustest.JetStream(t, signer), msg); err != nil {
		t.Fatal(err)
	}
}

// TestReadFromATimeThenFollow: with the audit credential alone, a reader replays
// from a point in time, filtered, then follows live events, none lost or doubled.
func TestReadFromATimeThenFollow(t *testing.T) {
	m := bustest.SecureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	if _, err := bus.EnsureEventStream(ctx, bustest.JetStream(t, signer), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		issue(t, signer, fmt.Sprintf("p%d", i))
	}
	since := time.Now()
	for i := range 5 {
		issue(t, signer, fmt.Sprintf("p%d", i))
	}
	var errs bustest.Errors
	audit := m.Conn(t, policy.Audit, &errs)
	l, err := auditlog.Open(ctx, audit)
	if err != nil {
		t.Fatalf("audit opens the stream: %v", err)
	}

	// Filtered replays, no follow.
	count := func(f auditlog.Filter) int {
		n := 0
		if err := l.Read(ctx, f, false, nil, func(e auditlog.Entry) error {
			if e.Err != nil {
				t.Errorf("entry %d: %v", e.Seq, e.Err)
			}
			n++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tt := range []struct {
		name string
		f    auditlog.Filter
		want int
	}{
		{"everything", auditlog.Filter{}, 10},
		{"since", auditlog.Filter{Since: since}, 5},
		{"pod", auditlog.Filter{Pod: "default/p1"}, 2},
		{"pod since", auditlog.Filter{Pod: "default/p1", Since: since}, 1},
		{"short type", auditlog.Filter{Types: []string{"cert.issued"}}, 10},
		{"other type", auditlog.Filter{Types: []string{"trust.changed", events.TypePodDown}}, 0},
		{"future", auditlog.Filter{Since: time.Now().Add(time.Hour)}, 0},
		{"last 3", auditlog.Filter{Last: 3}, 3},
		{"since, last 3", auditlog.Filter{Since: since, Last: 3}, 3},
		{"since, last 30", auditlog.Filter{Since: since, Last: 30}, 5},
		{"last 3 of p4", auditlog.Filter{Pod: "default/p4", Last: 3}, 1},
	} {
		if got := count(tt.f); got != tt.want {
			t.Errorf("%s: %d entries, want %d", tt.name, got, tt.want)
		}
	}

	// A replay up to sequence 0 (an empty stream's end, as Read found it) is
	// empty, whatever the stream holds by then: the events published since are
	// the follow's, live.
	n := 0
	if err := l.Replay(ctx, 0, 0, auditlog.Filter{}, func(auditlog.Entry) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("replay to 0: %d entries, %v", n, err)
	}

	// Since, then follow: the replay starts where it says, live events follow.
	var mu sync.Mutex
	var got []auditlog.Entry
	var start auditlog.Start
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		done <- l.Read(rctx, auditlog.Filter{Since: since}, true, func(s auditlog.Start) { start = s; close(started) }, func(e auditlog.Entry) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, e)
			return nil
		})
	}()
	<-started
	if start.Seq != 6 || start.Last != 10 {
		t.Errorf("start %+v, want sequence 6 up to 10", start)
	}
	for i := range 3 {
		issue(t, signer, fmt.Sprintf("live%d", i))
	}
	testkit.Eventually(t, "5 replayed and 3 live events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 8
	})
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, e := range got {
		if ids[e.Meta.ID] {
			t.Errorf("event %s given twice", e.Meta.ID)
		}
		ids[e.Meta.ID] = true
	}
	if len(got) != 8 || got[0].Seq != 6 || got[7].Pod() != "default/live2" {
		t.Errorf("got %d entries, first seq %d", len(got), got[0].Seq)
	}
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("the audit role was refused reading: %v", e)
	}
}

func TestSinkRotatesBySize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := auditlog.NewSink(path, 2048, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auditlog.NewSink("", 10, -1); err == nil {
		t.Fatal("bad settings accepted")
	}
	for i := range 40 {
		e := auditlog.Entry{Seq: uint64(i + 1), Subject: events.SubjectCertIssued, Meta: events.Meta{ID: fmt.Sprint(i), Type: events.TypePodDown, Time: time.Now()},
			Payload: events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "p"}, Reason: "r"}}
		if err := s.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{path, path + ".1", path + ".2"} {
		f, err := os.Open(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		st, _ := f.Stat()
		if st.Size() > 2048 || st.Size() == 0 {
			t.Errorf("%s: %d bytes, want 1 to 2048", name, st.Size())
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var v map[string]any
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil || v["type"] != events.TypePodDown {
				t.Errorf("%s: line %q: %v", name, sc.Text(), err)
			}
		}
		_ = f.Close()
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Fatalf("more files kept than asked: %v", err)
	}
}
