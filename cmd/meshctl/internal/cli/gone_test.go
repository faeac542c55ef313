package cli

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
)

// fakeFleet answers every page with certs.
type fakeFleet struct{ certs []inventory.Cert }

func (f fakeFleet) Page(context.Context, url.Values) (inventory.Page, error) {
	return inventory.Page{Total: len(f.certs), Certs: f.certs}, nil
}
func (fakeFleet) String() string { return "fake" }

// TestStatusTellsGoneHoldersFromFailures: renewal retries to a holder that no
// longer answers (the README's VM after its process is gone) are named on a row
// of their own and need no attention; retries with no such holder, and NACKs,
// do.
func TestStatusTellsGoneHoldersFromFailures(t *testing.T) {
	retries := inventory.Tally{Renewals: map[string]int{events.RenewRetry: 6}}
	vm := inventory.Cert{Pod: "default/vm-1", SPIFFEID: "spiffe://cluster.local/ns/default/sa/demo"}
	for _, tc := range []struct {
		name      string
		counts    inventory.Counts
		attention bool
	}{
		{"retries to a gone holder", inventory.Counts{Silent: 1, LastHour: retries}, false},
		{"retries, no gone holder", inventory.Counts{LastHour: retries}, true},
		{"a NACK beside a gone holder", inventory.Counts{Silent: 1, LastHour: inventory.Tally{SDSNacks: 1}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			row := func(k, f string, a ...any) { fmt.Fprintf(&out, "%s %s\n", k, fmt.Sprintf(f, a...)) }
			got := goneStatus(context.Background(), fakeFleet{certs: []inventory.Cert{vm}}, tc.counts, row)
			if (len(got) > 0) != tc.attention {
				t.Fatalf("attention %v, want %v\n%s", got, tc.attention, out.String())
			}
			if tc.counts.Silent > 0 && !strings.Contains(out.String(), "gone 1 holder(s)") || tc.counts.Silent > 0 && !strings.Contains(out.String(), "default/vm-1") {
				t.Fatalf("the gone holder is not named:\n%s", out.String())
			}
		})
	}
}
