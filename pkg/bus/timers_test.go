package bus_test

import (
	"testing"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
)

// TestClientsWaitLongerThanTheirServers: a client never gives up on a
// connection before the server it connects to does (issue 35): the hub's
// clients outwait its auth timeout, embedded or file-configured, and a node's
// pods outwait their node's leaf server.
func TestClientsWaitLongerThanTheirServers(t *testing.T) {
	for _, c := range []struct {
		name           string
		client, server interface{ Seconds() float64 }
	}{
		{"hub, embedded", bus.ConnectTimeout, embedded.EmbeddedAuthTimeout + embedded.EmbeddedTLSTimeout},
		{"hub, configured", bus.ConnectTimeout, policy.AuthTimeout},
		{"node", bus.NodeLocalConnectTimeout, embedded.LeafAuthTimeout},
	} {
		if c.client.Seconds() < c.server.Seconds() {
			t.Errorf("%s: the client gives up after %gs, its server waits %gs", c.name, c.client.Seconds(), c.server.Seconds())
		}
	}
}
