package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/inventory/fleetindex"
)

// indexSource serves pages of an index as the operator's API does (its query
// parsing and its index), counting them.
type indexSource struct {
	ix    *fleetindex.Index
	pages int
}

func (s *indexSource) String() string { return "test index" }

func (s *indexSource) Page(_ context.Context, v url.Values) (inventory.Page, error) {
	q, err := fleetindex.ParseQuery(v)
	if err != nil {
		return inventory.Page{}, err
	}
	s.pages++
	return s.ix.Page(q, time.Now()), nil
}

func indexOf(t *testing.T, certs ...inventory.Cert) *indexSource {
	t.Helper()
	ix := fleetindex.New()
	for _, c := range certs {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if ix.Put(inventory.KeyOfCert(c), b) {
			t.Fatalf("record of %s skipped", c.Pod)
		}
	}
	return &indexSource{ix: ix}
}

// TestRootProgressCountsLivePods: rotate root -wait waits for the pods that answer,
// from the fleet's counts (two pages, whatever the fleet). A VM whose holder is
// gone (issue 29's vm-1: the rotator told it to renew, then had to tell it again)
// and a pod with an expired certificate are left out and named; a pod that said it
// stopped is left out silently; a named signer's certificate never ends at the
// mesh's root and is not waited for.
func TestRootProgressCountsLivePods(t *testing.T) {
	now := time.Now()
	issued := now.Add(-10 * time.Minute)
	cert := func(pod, root string) inventory.Cert {
		return inventory.Cert{Pod: pod, Resource: "default", Root: root, Serial: fmt.Sprintf("%x", len(pod)*7919+len(root)), SPIFFEID: "spiffe://cluster.local/ns/default/sa/" + pod[8:],
			NotBefore: issued, NotAfter: now.Add(time.Hour), Issued: issued}
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
	noPod := inventory.Cert{Root: "old", Serial: "0abc", SPIFFEID: "spiffe://cluster.local/ns/default/sa/agent", NotBefore: issued, NotAfter: now.Add(time.Hour)}

	src := indexOf(t, fresh, renewing, gone, expired, down, partner, noPod)
	p, err := fleetProgress(context.Background(), src, "new", now)
	if err != nil {
		t.Fatal(err)
	}
	if p.held != 1 || p.total != 2 || p.named != 1 || src.pages != 2 {
		t.Fatalf("progress %+v in %d pages: want 1/2 live, 1 named, in 2 pages", p, src.pages)
	}
	out := p.leftOut()
	if !strings.Contains(out, "default/vm-1 (told to renew again") || !strings.Contains(out, "default/demo-9 (certificate expired)") ||
		strings.Contains(out, "demo-8") || strings.Contains(out, "demo-1") || strings.Contains(out, "more") {
		t.Fatalf("left out: %q", out)
	}
	if l := p.line(); l != "1/2 live pod certificate(s) under the new root (1 of named signers not counted)" {
		t.Fatalf("line %q", l)
	}
	// Once demo-1 renews under the new root, the wait is over, vm-1 or not.
	renewing.Root, renewing.Issued = "new", now
	if p, err := fleetProgress(context.Background(), indexOf(t, fresh, renewing, gone), "new", now); err != nil || p.held != p.total || p.total != 2 {
		t.Fatalf("after demo-1 renewed: %+v, %v", p, err)
	}
}
