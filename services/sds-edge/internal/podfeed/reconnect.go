package podfeed

import "github.com/nats-io/nats.go"

// OnReconnect adds fn to nc's reconnect handler, keeping the one already set.
func OnReconnect(nc *nats.Conn, fn func()) {
	prev := nc.Opts.ReconnectedCB
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		fn()
	})
}
