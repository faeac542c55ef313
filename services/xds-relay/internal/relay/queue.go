package relay

import (
	"context"
	"sync"
)

// queue is the unbounded request queue of one stream: reading from Envoy never
// waits for the upstream, as in Istio's XdsProxy. Envoy sends few requests (one per
// type, plus ACKs), so the queue stays short in practice.
type queue struct {
	mu     sync.Mutex
	items  []*frame
	signal chan struct{}
}

func newQueue() *queue { return &queue{signal: make(chan struct{}, 1)} }

func (q *queue) push(f *frame) {
	q.mu.Lock()
	q.items = append(q.items, f)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *queue) pop(ctx context.Context) (*frame, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			f := q.items[0]
			q.items[0] = nil
			q.items = q.items[1:]
			q.mu.Unlock()
			return f, nil
		}
		q.mu.Unlock()
		select {
		case <-q.signal:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
