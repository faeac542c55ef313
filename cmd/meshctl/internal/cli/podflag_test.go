package cli

import (
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
)

func TestPodFlags(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want events.PodRef
		ok   bool
	}{
		{"demo-0", events.PodRef{Namespace: "default", Name: "demo-0"}, true},
		{"attacker/demo-0", events.PodRef{Namespace: "attacker", Name: "demo-0"}, true},
		{"Attacker/demo-0", events.PodRef{}, false},
		{"a/b/c", events.PodRef{}, false},
		{"", events.PodRef{}, false},
	} {
		got, err := parsePod(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("parsePod(%q) = %v, %v", tc.in, got, err)
		}
	}
	// A minted token binds a pod of its own namespace: a bare name is in -ns, and
	// another namespace is an error, not a quiet default.
	for _, tc := range []struct {
		ns, in string
		want   events.PodRef
		ok     bool
	}{
		{"shop", "web-0", events.PodRef{Namespace: "shop", Name: "web-0"}, true},
		{"shop", "shop/web-0", events.PodRef{Namespace: "shop", Name: "web-0"}, true},
		{"shop", "default/web-0", events.PodRef{}, false},
		{"shop", "web*", events.PodRef{}, false},
	} {
		got, err := mintPod(tc.ns, tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("mintPod(%q, %q) = %v, %v", tc.ns, tc.in, got, err)
		}
	}
}
