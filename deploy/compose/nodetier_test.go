//go:build compose

package compose

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

// nodes are the compose stack's node tiers, each with one pod on it.
var nodes = []struct{ node, pod string }{{"node-a", "web-a"}, {"node-b", "web-b"}}

// checkNodeTier: the hub holds one leaf connection per node agent and no other,
// and the pod on each node is certified through it (its sds-edge knows only its
// node agent's URL, and has no gRPC fallback).
func checkNodeTier(t *testing.T, st *stack) {
	var leafs []string
	testkit.EventuallyWithin(t, 2*time.Minute, "one leaf connection per node on the hub", func() bool {
		leafs = nil
		for _, n := range natsNodes {
			var z struct {
				Leafs []struct {
					Name string `json:"name"`
				} `json:"leafs"`
			}
			if err := st.monitorGet(n, "/leafz", &z); err != nil {
				return false
			}
			for _, l := range z.Leafs {
				leafs = append(leafs, l.Name)
			}
		}
		return len(leafs) == len(nodes)
	})
	for _, n := range nodes {
		if !slices.ContainsFunc(leafs, func(name string) bool { return strings.Contains(name, n.node) }) {
			t.Errorf("no leaf connection of %s among %v", n.node, leafs)
		}
	}
	for _, n := range nodes {
		url := st.nodePodReady[n.pod]
		testkit.EventuallyWithin(t, 2*time.Minute, n.pod+" certified through "+n.node, func() bool {
			c := http.Client{Timeout: 3 * time.Second}
			resp, err := c.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
}
