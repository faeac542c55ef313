package auditlog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go"
)

// podDown is a pod.down naming named, published on from's own subject.
func podDown(t *testing.T, from, named events.PodRef) *nats.Msg {
	t.Helper()
	subject, err := events.PodEventSubject(from, events.PodEventDown)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := events.NewMsg(subject, "sds-edge/"+from.String(), events.PodDown{Pod: named, Reason: "stopping"})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// TestForgedPodEventIsNotTheVictims: a pod publishes only on its own subjects, so
// a pod.down it publishes there naming another pod is the publisher's forgery,
// not the victim's event. The reader (meshctl events) neither lists it under the
// victim nor prints it as the victim going down; it shows it on the publisher's
// subject, marked. The attacker's own pod.down (the positive control) reads as
// it always did.
func TestForgedPodEventIsNotTheVictims(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := bus.EnsureEventStream(ctx, js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	attacker := events.PodRef{Namespace: "attacker", Name: "demo-1"}
	victim := events.PodRef{Namespace: "default", Name: "demo-1"}
	for _, m := range []*nats.Msg{podDown(t, attacker, victim), podDown(t, attacker, attacker)} {
		if err := bus.Publish(ctx, js, m); err != nil {
			t.Fatal(err)
		}
	}
	l, err := auditlog.Open(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	read := func(f auditlog.Filter) []auditlog.Entry {
		var out []auditlog.Entry
		if err := l.Read(ctx, f, false, nil, func(e auditlog.Entry) error { out = append(out, e); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := read(auditlog.Filter{Pod: victim.String()}); len(got) != 0 {
		t.Fatalf("the victim's events list %d entries: %s", len(got), got[0].Line(time.Now()))
	}
	all := read(auditlog.Filter{})
	if len(all) != 2 {
		t.Fatalf("%d entries, want 2", len(all))
	}
	forged, own := all[0], all[1]
	if !errors.Is(forged.Err, auditlog.ErrPodMismatch) || forged.Pod() != attacker.String() {
		t.Fatalf("forged pod.down read as pod %q, err %v", forged.Pod(), forged.Err)
	}
	if line := forged.Line(time.Now()); strings.Contains(line, victim.String()+" down") || !strings.Contains(line, forged.Subject) {
		t.Fatalf("forged pod.down printed as %q", line)
	}
	if own.Err != nil || !strings.Contains(own.Line(time.Now()), attacker.String()+" down") {
		t.Fatalf("the attacker's own pod.down printed as %q (%v)", own.Line(time.Now()), own.Err)
	}
	// meshctl up's live view decodes with the same function.
	if e := auditlog.Decode(podDown(t, attacker, victim), 0); !errors.Is(e.Err, auditlog.ErrPodMismatch) {
		t.Fatalf("live: forged pod.down decoded as %v", e.Payload)
	}
}
