package auditlog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
)

// The history is the CA's stream and the pods' stream merged by time: a reader
// with the audit credential gets both, in order, each entry saying its stream.
func TestReadMergesThePodsStream(t *testing.T) {
	m := bustest.SecureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	if _, err := bus.EnsureEventStream(ctx, bustest.JetStream(t, signer), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	m.ServeCallout(t, bustest.PodTokens)
	var want []string
	for i := range 4 {
		issue(t, signer, fmt.Sprintf("p%d", i))
		want = append(want, events.StreamEvents)
		ref := events.PodRef{Namespace: "default", Name: fmt.Sprintf("p%d", i)}
		pod, err := m.PodConn(t, ref, "pod:"+ref.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		subj, _ := events.PodEventSubject(ref, events.PodEventDown)
		msg, err := events.NewMsg(subj, "sds-edge", events.PodDown{Pod: ref})
		if err != nil {
			t.Fatal(err)
		}
		if err := bus.Publish(ctx, bustest.JetStream(t, pod), msg); err != nil {
			t.Fatal(err)
		}
		want = append(want, events.StreamPodEvents)
	}
	l, err := auditlog.Open(ctx, m.Conn(t, policy.Audit, nil))
	if err != nil {
		t.Fatal(err)
	}
	var got []auditlog.Entry
	var start auditlog.Start
	if err := l.Read(ctx, auditlog.Filter{}, false, func(s auditlog.Start) { start = s }, func(e auditlog.Entry) error {
		got = append(got, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || start.Pods == nil || start.Pods.Bounds.Messages != 4 || start.Bounds.Messages != 4 {
		t.Fatalf("read %d entries (start %+v), want %d", len(got), start, len(want))
	}
	for i, e := range got {
		if e.Err != nil || e.Stream != want[i] || (i > 0 && e.Meta.Time.Before(got[i-1].Meta.Time)) {
			t.Fatalf("entry %d: %s seq %d at %s (%v), want from %s in time order", i, e.Stream, e.Seq, e.Meta.Time, e.Err, want[i])
		}
	}
	// Filtered by pod: its certificate and its own event.
	n := 0
	if err := l.Read(ctx, auditlog.Filter{Pod: "default/p2"}, false, nil, func(e auditlog.Entry) error { n++; return nil }); err != nil || n != 2 {
		t.Fatalf("pod p2: %d entries, %v", n, err)
	}
}
