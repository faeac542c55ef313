package podfeed

import "github.com/nats-io/nats.go"

// OnReconnect adds fn to nc's reconnect handler, keeping the one already set. A
// connection made in the background (bus.Config.Background) calls it on its first
// connect too.
func OnReconnect(nc *nats.Conn, fn func()) {
	prev := nc.ReconnectHandler()
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		fn()
	})
}
