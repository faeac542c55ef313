package admit

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// verifierFunc verifies a token by what the test says of it.
type verifierFunc func(string) (Pod, error)

func (f verifierFunc) VerifyPod(token string) (Pod, error) { return f(token) }

// TestAdmitGivesOnlyThisNodesPodItsOwnSubjects: a pod whose token binds it to
// this node is admitted with ForNodePod's permissions until its token expires
// (or sooner); every other token is refused with its reason, counted.
func TestAdmitGivesOnlyThisNodesPodItsOwnSubjects(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	web := events.PodRef{Namespace: "shop", Name: "web-0"}
	pods := map[string]Pod{
		"own":     {Pod: web, Node: "node-a", Expires: now.Add(time.Hour)},
		"other":   {Pod: web, Node: "node-b", Expires: now.Add(time.Hour)},
		"nopod":   {Node: "node-a", Expires: now.Add(time.Hour)},
		"expired": {Pod: web, Node: "node-a", Expires: now},
	}
	v := verifierFunc(func(tok string) (Pod, error) {
		if p, ok := pods[tok]; ok {
			return p, nil
		}
		return Pod{}, errors.New("bad signature")
	})
	a := New("node-a", v, policy.DefaultPodLimits(), clock.NewFake(now), hclog.NewNullLogger(), prometheus.NewRegistry())

	u, err := a.Admit(embedded.LeafClient{Token: "own"})
	if err != nil {
		t.Fatalf("this node's pod: %v", err)
	}
	want, _ := policy.ForNodePod("node-a", web)
	if u.Name != "pod/shop/web-0" || !slices.Equal(u.Permissions.Publish, want.Publish) || !slices.Equal(u.Permissions.Subscribe, want.Subscribe) {
		t.Errorf("admitted as %q with %+v, want pod/shop/web-0 with %+v", u.Name, u.Permissions, want)
	}
	if !u.Expires.After(now) || u.Expires.After(now.Add(time.Hour)) {
		t.Errorf("user expires %s, want after %s and not after the token (%s)", u.Expires, now, now.Add(time.Hour))
	}
	hub, _ := events.PodSignSubject(web)
	if slices.Contains(u.Permissions.Publish, hub) {
		t.Errorf("a node's pod may publish on its hub sign subject %s", hub)
	}

	for tok, reason := range map[string]string{"": ReasonToken, "forged": ReasonToken, "other": ReasonNode, "nopod": ReasonNoPod, "expired": ReasonExpiry} {
		if u, err := a.Admit(embedded.LeafClient{Token: tok}); err == nil {
			t.Errorf("token %q admitted as %q", tok, u.Name)
		}
		if n := testutil.ToFloat64(a.refused.WithLabelValues(reason)); n < 1 {
			t.Errorf("token %q: no refusal counted as %q", tok, reason)
		}
	}
	if n := testutil.ToFloat64(a.admitted); n != 1 {
		t.Errorf("%v admissions counted, want 1", n)
	}
	if _, err := a.Admit(embedded.LeafClient{Token: "other"}); err == nil || !strings.Contains(err.Error(), `bound to node "node-b"`) {
		t.Errorf("another node's pod: %v, want it named", err)
	}
}
