package policy_test

import (
	"os"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
)

// TestSecurityDocMatchesTable: docs/security.md names every core subject each role
// may use, so the page and the enforced table cannot drift apart silently.
func TestSecurityDocMatchesTable(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	check := func(role string, subjects []string) {
		for _, s := range subjects {
			s, _, _ = strings.Cut(s, " ") // "subject queue"
			if strings.HasPrefix(s, "$JS.") || strings.HasPrefix(s, "$KV.") {
				continue // JetStream access is described per stream and bucket
			}
			if !strings.Contains(string(doc), "`"+s+"`") {
				t.Errorf("docs/security.md does not name %s's subject `%s`", role, s)
			}
		}
	}
	for _, r := range policy.Users {
		p, err := policy.For(r)
		if err != nil {
			t.Fatal(err)
		}
		check(string(r), append(p.Publish, p.Subscribe...))
	}
	p, err := policy.ForPod(events.PodRef{Namespace: "ns", Name: "name"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(p.Publish, p.Subscribe...) {
		s = strings.ReplaceAll(strings.ReplaceAll(s+".", ".ns.name.", ".<ns>.<name>."), "..", ".")
		check("pod", []string{strings.TrimSuffix(s, ".")})
	}
	n, err := policy.ForNode("nodename")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(n.Publish, n.Subscribe...) {
		check("node", []string{strings.ReplaceAll(s, ".nodename.", ".<node>.")})
	}
}
