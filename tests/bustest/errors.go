package bustest

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// Errors collects the asynchronous errors a server reports to a client (permission
// violations arrive this way, after the publish or subscribe already returned).
type Errors struct {
	mu   sync.Mutex
	errs []error
}

// Handler collects into e (nothing when e is nil), as nats.ErrorHandler's argument.
func (e *Errors) Handler() nats.ErrHandler { return e.handler() }

func (e *Errors) handler() nats.ErrHandler {
	return func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if e == nil {
			return
		}
		e.mu.Lock()
		e.errs = append(e.errs, err)
		e.mu.Unlock()
	}
}

// All returns the errors so far.
func (e *Errors) All() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.errs...)
}
