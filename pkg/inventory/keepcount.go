package inventory

import (
	"context"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// counting gathers the counts of the events a keeper has folded in, by minute,
// with the messages that brought them: a message is acknowledged only once its
// count is stored, so that an event is never lost from the counts (a keeper that
// dies first leaves it to be delivered again, to itself or another replica). One
// write a minute record and interval, not one per event: a burst of thousands of
// certificates is a few compare-and-sets on one key, however many replicas share
// the work.
type counting struct {
	mu      sync.Mutex
	pending map[int64]*heldWindow
}

type heldWindow struct {
	delta Window
	msgs  []jetstream.Msg
	ps    []events.Payload
}

// countEvery is how often the counts gathered are stored.
const countEvery = 250 * time.Millisecond

func (c *counting) hold(d Window, m jetstream.Msg, p events.Payload) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[int64]*heldWindow{}
	}
	h := c.pending[d.Minute]
	if h == nil {
		h = &heldWindow{delta: Window{Minute: d.Minute}}
		c.pending[d.Minute] = h
	}
	h.delta.Add(d)
	h.msgs = append(h.msgs, m)
	h.ps = append(h.ps, p)
}

func (c *counting) take() map[int64]*heldWindow {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending
	c.pending = nil
	return p
}

// countLoop stores the gathered counts every countEvery until ctx ends, then once
// more (briefly), so that a keeper stopped cleanly leaves nothing to redeliver.
func (k *Keeper) countLoop(ctx context.Context) error {
	t := k.clk.NewTimer(countEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			k.storeCounts(fctx)
			return nil
		case <-t.C():
			k.storeCounts(ctx)
			t.Reset(countEvery)
		}
	}
}

// storeCounts adds each minute's gathered counts to its record and acknowledges
// the events counted; those of a minute that could not be stored are offered
// again later.
func (k *Keeper) storeCounts(ctx context.Context) {
	for minute, h := range k.counts.take() {
		err := k.update(ctx, CounterKey(minute), func(cur []byte) ([]byte, bool, error) { return merge(cur, h.delta) })
		if err != nil {
			k.log.Warn("inventory counters: not stored, will retry", "minute", time.Unix(minute*60, 0).UTC(), "events", len(h.msgs), "error", err)
			for _, m := range h.msgs {
				_ = m.NakWithDelay(time.Second)
			}
			continue
		}
		for i, m := range h.msgs {
			_ = m.Ack()
			if k.Applied != nil {
				k.Applied(h.ps[i])
			}
		}
	}
}
