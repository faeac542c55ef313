package cli

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

// TestUpPrintLeavesBenchOut: meshctl up's live print shows the fleet's events and
// not meshctl bench's (issue 29: 33,649 lines in the terminal), said once.
func TestUpPrintLeavesBenchOut(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	h := printer(func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() })
	now := time.Now()
	issued := func(ns string, i int) {
		msg, err := events.NewMsg(events.SubjectCertIssued, "signer-0", events.CertIssued{Serial: "0" + string(rune('a'+i)),
			SPIFFEID: "spiffe://td/ns/" + ns + "/sa/load", NotBefore: now, NotAfter: now.Add(time.Hour),
			KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "r"})
		if err != nil {
			t.Fatal(err)
		}
		h(msg)
	}
	for i := range 5 {
		issued(events.BenchNamespace, i)
	}
	issued("default", 9)
	if len(lines) != 2 || !strings.Contains(lines[0], "meshagent-bench (meshctl bench) are not printed") ||
		!strings.Contains(lines[1], "spiffe://td/ns/default/sa/load") {
		t.Fatalf("printed %q", lines)
	}
}

// TestUpPrintForgedPodDownIsNotTheVictims: a pod.down a pod publishes on its own
// subject naming another pod is not printed as the victim going down (the rotator
// and the inventory drop it too); the publisher's own pod.down still is.
func TestUpPrintForgedPodDownIsNotTheVictims(t *testing.T) {
	var lines []string
	h := printer(func(l string) { lines = append(lines, l) })
	attacker := events.PodRef{Namespace: "attacker", Name: "demo-1"}
	victim := events.PodRef{Namespace: "default", Name: "demo-1"}
	subject, _ := events.PodEventSubject(attacker, events.PodEventDown)
	for _, named := range []events.PodRef{victim, attacker} {
		msg, err := events.NewMsg(subject, "sds-edge", events.PodDown{Pod: named, Reason: "stopping"})
		if err != nil {
			t.Fatal(err)
		}
		h(msg)
	}
	if len(lines) != 2 || strings.Contains(lines[0], "default/demo-1 down") || !strings.Contains(lines[0], subject) ||
		!strings.Contains(lines[1], "attacker/demo-1 down") {
		t.Fatalf("printed %q", lines)
	}
}
