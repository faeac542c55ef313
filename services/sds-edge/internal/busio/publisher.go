// Package busio is sds-edge's side of the bus: an event publisher that never blocks
// the SDS path, and the subscriptions that feed renewals and trust changes in.
package busio

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
)

// Publisher publishes events to JetStream from a bounded queue, in order.
type Publisher struct {
	js     jetstream.JetStream
	source string
	log    hclog.Logger
	q      chan *nats.Msg
	lost   func()
	done   chan struct{}
}

// NewPublisher returns a publisher with a queue of size; lost is called for every
// event dropped because the queue is full.
func NewPublisher(js jetstream.JetStream, source string, size int, lost func(), log hclog.Logger) *Publisher {
	return &Publisher{js: js, source: source, log: log, q: make(chan *nats.Msg, size), lost: lost, done: make(chan struct{})}
}

// Publish queues p for subject without blocking. An invalid payload is logged and dropped.
func (p *Publisher) Publish(subject string, payload events.Payload) {
	msg, err := events.NewMsg(subject, p.source, payload)
	if err != nil {
		p.log.Error("invalid event not published", "subject", subject, "error", err)
		return
	}
	select {
	case p.q <- msg:
	default:
		p.lost()
		p.log.Warn("event queue full, event dropped", "subject", subject)
	}
}

// Run publishes queued events until ctx ends, then keeps publishing what is queued
// for up to flush more (pod.down is queued last). It returns nil.
func (p *Publisher) Run(ctx context.Context, flush time.Duration) error {
	defer close(p.done)
	// hard ends every publish, including one in progress, flush after ctx ends.
	hard, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(flush, cancel) })
	defer stop()
	for {
		select {
		case msg := <-p.q:
			p.send(hard, msg)
		case <-ctx.Done():
			for {
				select {
				case msg := <-p.q:
					if hard.Err() != nil {
						return nil
					}
					p.send(hard, msg)
				default:
					return nil
				}
			}
		}
	}
}

func (p *Publisher) send(ctx context.Context, msg *nats.Msg) {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := bus.Publish(pctx, p.js, msg); err != nil {
		p.log.Warn("event not published", "subject", msg.Subject, "error", err)
	}
}
