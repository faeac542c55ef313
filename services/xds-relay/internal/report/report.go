// Package report publishes the relay's events (connected, disconnected, NACK) to
// JetStream in the background, so that a slow or absent bus never holds up a
// stream. Events beyond a bounded backlog are dropped and counted.
package report

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Backlog is how many events may wait for the bus.
const Backlog = 1024

// Publisher queues events and publishes them in order.
type Publisher struct {
	js      jetstream.JetStream
	source  string
	log     hclog.Logger
	ch      chan *nats.Msg
	dropped prometheus.Counter
}

// New returns a Publisher for source (the CloudEvents source, e.g. "xds-relay/web-0").
func New(js jetstream.JetStream, source string, reg prometheus.Registerer, log hclog.Logger) *Publisher {
	p := &Publisher{js: js, source: source, log: log, ch: make(chan *nats.Msg, Backlog),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "xds_relay_events_dropped_total",
			Help: "Events not published because the bus was too slow or an event was invalid."})}
	if reg != nil {
		reg.MustRegister(p.dropped)
	}
	return p
}

// Publish queues p on subject; it never blocks.
func (p *Publisher) Publish(subject string, e events.Payload) {
	msg, err := events.NewMsg(subject, p.source, e)
	if err != nil {
		p.dropped.Inc()
		p.log.Warn("dropping invalid event", "type", e.EventType(), "error", err)
		return
	}
	select {
	case p.ch <- msg:
	default:
		p.dropped.Inc()
		p.log.Warn("event backlog full, dropping event", "type", e.EventType())
	}
}

// Run publishes queued events until ctx ends, then flushes what is queued for at
// most two seconds.
func (p *Publisher) Run(ctx context.Context) error {
	for {
		select {
		case msg := <-p.ch:
			// Not tied to ctx: an event in flight at shutdown is still delivered.
			p.send(context.Background(), msg)
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			for {
				select {
				case msg := <-p.ch:
					p.send(fctx, msg)
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
		p.dropped.Inc()
		p.log.Warn("cannot publish event", "subject", msg.Subject, "error", err)
	}
}
