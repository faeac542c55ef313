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
	items  []*frame // items[head:] are queued
	head   int
	closed bool
	signal chan struct{}
}

func newQueue() *queue { return &queue{signal: make(chan struct{}, 1)} }

func (q *queue) push(f *frame) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		f.free()
		return
	}
	if q.head > 0 && len(q.items) == cap(q.items) { // full: move the queued to the front
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, f)
	q.mu.Unlock()
	q.wake()
}

func (q *queue) pop(ctx context.Context) (*frame, error) {
	for {
		q.mu.Lock()
		if q.head < len(q.items) {
			f := q.items[q.head]
			q.items[q.head] = nil
			q.head++
			if q.head == len(q.items) { // empty: reuse the array from its start
				q.items, q.head = q.items[:0], 0
			}
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

func (q *queue) wake() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// close frees the frames still queued and every frame pushed later: the stream
// has ended, and a sender still running finds the queue empty.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, f := range q.items[q.head:] {
		f.free()
	}
	q.items, q.head = nil, 0
}
