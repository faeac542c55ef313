package bus

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A flood of one pod's events replaces only that pod's older events of the same
// kind: the CA's history and another pod's events keep every message, at the same
// sequences.
func TestPodFloodKeepsCAHistoryAndOtherPods(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limits := PodEventLimits{MaxMsgsPerSubject: 5, MaxBytes: 1 << 20}
	n := 0
	ca, err := EnsureEventStreamRetention(ctx, js, 1, Retention{MaxAge: time.Hour, MaxBytes: 2 << 20, Pods: limits})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(i int) {
		if err := Publish(ctx, js, rawEvent(events.SubjectCertIssued, fmt.Sprint("issued-", i), 512)); err != nil {
			t.Fatal(err)
		}
	}
	podEvent := func(pod string) {
		subj, _ := events.PodEventSubject(ref(pod), events.PodEventUp)
		// As large as a pod event may be, its headers included.
		n++
		if err := Publish(ctx, js, rawEvent(subj, fmt.Sprint(pod, n), events.MaxEventSize-1024)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		issue(i)
		podEvent("victim")
	}
	before, err := ca.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 40 × 64 KiB: 2.5 MiB, more than either stream may hold.
	for range 40 {
		podEvent("flooder")
	}
	after, err := ca.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.FirstSeq != before.State.FirstSeq || after.State.Msgs != 3 {
		t.Fatalf("CA history moved: first %d -> %d, %d messages", before.State.FirstSeq, after.State.FirstSeq, after.State.Msgs)
	}
	pods, err := js.Stream(ctx, events.StreamPodEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := pods.Info(ctx, jetstream.WithSubjectFilter(events.PodEventsWildcard))
	if err != nil {
		t.Fatal(err)
	}
	victim, _ := events.PodEventSubject(ref("victim"), events.PodEventUp)
	flooder, _ := events.PodEventSubject(ref("flooder"), events.PodEventUp)
	if info.State.Subjects[victim] != 3 || info.State.Subjects[flooder] != 5 {
		t.Fatalf("pods' stream holds %v, want victim 3 and flooder 5", info.State.Subjects)
	}
	// A pod event larger than the bound is refused, not stored.
	subj, _ := events.PodEventSubject(ref("flooder"), events.PodEventUp)
	big := rawEvent(subj, "big", DefaultPodEventsMaxMsgSize+1)
	if _, err := js.PublishMsg(ctx, big); err == nil {
		t.Fatal("oversize pod event stored")
	}
	// Nor one the readers would refuse (a body over events.MaxEventSize, 65,536:
	// the break-in's 68 KB bodies were stored, and every reader refused them).
	if _, err := js.PublishMsg(ctx, rawEvent(subj, "over-the-readers", events.MaxEventSize+1)); err == nil {
		t.Fatal("a pod event the readers refuse was stored")
	}
	if again, err := pods.Info(ctx, jetstream.WithSubjectFilter(events.PodEventsWildcard)); err != nil || again.State.LastSeq != info.State.LastSeq {
		t.Fatalf("oversize pod event changed the stream: %v", err)
	}
}

// A CA stream from before the split (capturing meshagent.evt.>) is narrowed to
// the CA's subjects and keeps its messages; the pods' stream is created beside it.
func TestEnsureEventStreamSplitsAnOldStream(t *testing.T) {
	s := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: events.StreamEvents, Subjects: []string{events.EventsWildcard}, MaxBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := Publish(ctx, js, rawEvent(events.SubjectCertIssued, "issued-1", 100)); err != nil {
		t.Fatal(err)
	}
	st, err := EnsureEventStream(ctx, js, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(info.Config.Subjects, events.CAEventSubjects) || info.State.Msgs != 1 || info.Config.MaxBytes != 64<<20 {
		t.Fatalf("CA stream after the split: subjects %v, %d messages, max bytes %d", info.Config.Subjects, info.State.Msgs, info.Config.MaxBytes)
	}
	if _, err := js.Stream(ctx, events.StreamPodEvents); err != nil {
		t.Fatal(err)
	}
}

// rawEvent is a message of size bytes with an event id: the streams store what
// they are given, whatever its payload.
func rawEvent(subject, id string, size int) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(events.HeaderID, id)
	m.Data = make([]byte, size)
	return m
}
