package bustest

import (
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestRecordSeesWhatIsPublishedAfterItAndFindDecodesByType(t *testing.T) {
	nc := Conn(t, Server(t))
	up, _ := events.PodEventSubject(ref("web-0"), events.PodEventUp)
	down, _ := events.PodEventSubject(ref("web-0"), events.PodEventDown)
	r := Record(t, nc, up)
	for _, m := range []struct {
		subject string
		p       events.Payload
	}{{up, events.PodUp{Pod: ref("web-0"), Mode: "ca"}}, {down, events.PodDown{Pod: ref("web-0")}}, {up, events.PodUp{Pod: ref("web-1"), Mode: "ca"}}} {
		msg, err := events.NewMsg(m.subject, "test", m.p)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, "both pod.up recorded", func() bool { return len(r.Msgs()) == 2 })
	if got := Find(r, func(e events.PodUp) bool { return e.Pod == ref("web-1") }); len(got) != 1 {
		t.Fatalf("found %v", got)
	}
	if got := Find(r, func(events.PodDown) bool { return true }); len(got) != 0 {
		t.Fatalf("recorded a subject it was not made for: %v", got)
	}
}

func ref(name string) events.PodRef { return events.PodRef{Namespace: "default", Name: name} }
