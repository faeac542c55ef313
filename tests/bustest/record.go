package bustest

import (
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
)

// Recorder keeps every message seen on the subjects it was made for.
type Recorder struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

// Record subscribes nc to each subject until the test ends and returns what it
// records. The subscriptions are flushed before it returns, so a message published
// after Record is seen.
func Record(t testing.TB, nc *nats.Conn, subjects ...string) *Recorder {
	t.Helper()
	r := &Recorder{}
	for _, subject := range subjects {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) { r.mu.Lock(); r.msgs = append(r.msgs, m); r.mu.Unlock() })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

// Msgs is what was recorded so far, oldest first.
func (r *Recorder) Msgs() []*nats.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*nats.Msg(nil), r.msgs...)
}

// Find returns the recorded events of type T for which match holds, oldest first.
func Find[T events.Payload](r *Recorder, match func(T) bool) []T {
	var out []T
	for _, m := range r.Msgs() {
		if ev, _, err := events.Decode[T](m); err == nil && match(ev) {
			out = append(out, ev)
		}
	}
	return out
}
