// Package bustest starts a real embedded nats-server with JetStream for tests.
package bustest

import (
	"testing"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server starts an embedded server on a free loopback port with JetStream state in a
// fresh temp dir, and shuts it down when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Conn connects to s and closes the connection when the test ends.
func Conn(t testing.TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream context on nc.
func JetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
