package podfeed

import (
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestRenewFilteringAndDedup(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	var mu sync.Mutex
	var got []events.RenewDue
	unsub, err := Subscribe(nc, events.PodRef{Namespace: "default", Name: "web-0"}, Handlers{Renew: func(r events.RenewDue) { mu.Lock(); got = append(got, r); mu.Unlock() }}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer unsub()
	subj, _ := events.PodRenewSubject(events.PodRef{Namespace: "default", Name: "web-0"})
	send := func(id string, rd events.RenewDue) {
		t.Helper()
		msg, err := events.Encode(subj, events.Meta{ID: id, Source: "rotator"}, rd)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	send("a", events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Reason: "scheduled", Serial: "1"})
	send("a", events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Reason: "scheduled", Serial: "1"})        // repeat from a second replica
	send("b", events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: "web-1"}, Reason: "scheduled"})                     // another pod's
	send("e", events.RenewDue{Pod: events.PodRef{Namespace: "attacker", Name: "web-0"}, Reason: "forced"})                       // the same name in another namespace
	send("c", events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Resource: "ROOTCA", Reason: "scheduled"}) // not issued here
	_ = nc.PublishMsg(&nats.Msg{Subject: subj, Data: []byte("garbage")})                                                         // not an event
	send("d", events.RenewDue{Pod: events.PodRef{Namespace: "default", Name: "web-0"}, Resource: "default", Reason: "forced"})
	testkit.Eventually(t, "two renewals handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 2 })
	_ = nc.Flush()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].Serial != "1" || got[1].Reason != "forced" {
		t.Fatalf("handled %+v, want the first and the forced one", got)
	}
}
