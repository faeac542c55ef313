package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
)

// TestRootProgressCountsLivePods: rotate root -wait waits for the pods that answer.
// A VM whose holder is gone (issue 29's vm-1: the rotator told it to renew, then
// had to tell it again) and a pod with an expired certificate are left out and
// named; a pod that said it stopped is left out silently; a named signer's
// certificate never ends at the mesh's root and is not waited for.
func TestRootProgressCountsLivePods(t *testing.T) {
	now := time.Now()
	issued := now.Add(-10 * time.Minute)
	cert := func(pod, root string) inventory.Cert {
		return inventory.Cert{Pod: pod, Root: root, Serial: "01", NotBefore: issued, NotAfter: now.Add(time.Hour), Issued: issued}
	}
	fresh := cert("default/demo-0", "new")
	renewing := cert("default/demo-1", "old")
	renewing.LastRenewal, renewing.RenewSent = events.RenewRootRotation, now.Add(-time.Second) // told once: still counted
	gone := cert("default/vm-1", "old")
	gone.LastRenewal, gone.RenewSent = events.RenewRetry, now.Add(-5*time.Second)
	expired := cert("default/demo-9", "old")
	expired.NotAfter = now.Add(-time.Minute)
	down := cert("default/demo-8", "old")
	down.Down = true
	partner := cert("default/web", "partner-root")
	partner.CertSigner = "partner"
	noPod := inventory.Cert{Root: "old", NotAfter: now.Add(time.Hour)}

	p := rootProgress(inventory.Snapshot{Certs: []inventory.Cert{fresh, renewing, gone, expired, down, partner, noPod}}, "new", now)
	if p.held != 1 || p.total != 2 || p.named != 1 {
		t.Fatalf("progress %+v: want 1/2 live, 1 named", p)
	}
	out := p.leftOut()
	if !strings.Contains(out, "default/vm-1 (told to renew again") || !strings.Contains(out, "default/demo-9 (certificate expired)") ||
		strings.Contains(out, "demo-8") || strings.Contains(out, "demo-1") {
		t.Fatalf("left out: %q", out)
	}
	if l := p.line(); l != "1/2 live pod certificate(s) under the new root (1 of named signers not counted)" {
		t.Fatalf("line %q", l)
	}
	// Once demo-1 renews under the new root, the wait is over, vm-1 or not.
	renewing.Root, renewing.Issued = "new", now
	if p := rootProgress(inventory.Snapshot{Certs: []inventory.Cert{fresh, renewing, gone}}, "new", now); p.held != p.total || p.total != 2 {
		t.Fatalf("after demo-1 renewed: %+v", p)
	}
}
