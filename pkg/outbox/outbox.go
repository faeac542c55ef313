// Package outbox publishes a service's events to JetStream in the background, in
// order, from a bounded queue: Publish never blocks the caller (an SDS push, an
// xDS stream); while the stream is unavailable (a leader election, JetStream
// starting, the bus away) the queue holds the events and delivers them when it is
// back, each once (its event id is the dedup id); only an event the full queue has
// no room for, one the bus refuses, or one still queued when Run's flush time
// after shutdown runs out is dropped, and counted.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
)

// Defaults for Options left zero.
const (
	DefaultSize  = 1024
	DefaultFlush = 2 * time.Second
)

// Options configure an Outbox.
type Options struct {
	// Source is the CloudEvents source of every event, e.g. "sds-edge/web-0".
	Source string
	// Size is how many events may wait for the bus; DefaultSize when zero.
	Size int
	// Flush is how long Run keeps publishing the queue after its context ends (an
	// event in flight then included); DefaultFlush when zero.
	Flush time.Duration
	// Metric names the counter of events not published (queue full, invalid, or
	// refused by the bus), in the caller's namespace, e.g.
	// "meshagent_sds_edge_events_dropped_total". Required.
	Metric string
	// Registry gets the counter; nil leaves it unregistered.
	Registry prometheus.Registerer
	// Log gets one line per dropped event; nil discards.
	Log hclog.Logger
	// Clock times the waits between attempts and the flush after shutdown; nil:
	// the wall clock.
	Clock clock.Clock
}

// Outbox queues events and publishes them in order.
type Outbox struct {
	js      jetstream.JetStream
	o       Options
	q       chan *nats.Msg
	dropped prometheus.Counter
}

// New returns an Outbox publishing to js. It starts nothing until Run.
func New(js jetstream.JetStream, o Options) (*Outbox, error) {
	var errs []error
	if js == nil {
		errs = append(errs, errors.New("outbox: no JetStream context"))
	}
	if o.Source == "" {
		errs = append(errs, errors.New("outbox: Source is required"))
	}
	if o.Metric == "" {
		errs = append(errs, errors.New("outbox: Metric is required"))
	}
	if o.Size < 0 || o.Flush < 0 {
		errs = append(errs, fmt.Errorf("outbox: Size %d and Flush %s must not be negative", o.Size, o.Flush))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Flush == 0 {
		o.Flush = DefaultFlush
	}
	if o.Log == nil {
		o.Log = hclog.NewNullLogger()
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	b := &Outbox{js: js, o: o, q: make(chan *nats.Msg, o.Size),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: o.Metric,
			Help: "Events not published: the queue was full, the event was invalid or refused by the bus, or still queued when the service stopped."})}
	if o.Registry != nil {
		if err := o.Registry.Register(b.dropped); err != nil {
			return nil, fmt.Errorf("outbox: register %s: %w", o.Metric, err)
		}
	}
	return b, nil
}

// Publish queues payload for subject; it never blocks. An invalid event, or one the
// full queue has no room for, is logged, counted and dropped.
func (b *Outbox) Publish(subject string, payload events.Payload) {
	msg, err := events.Encode(subject, events.Meta{Source: b.o.Source, Time: b.o.Clock.Now()}, payload)
	if err != nil {
		b.dropped.Inc()
		b.o.Log.Error("invalid event not published", "subject", subject, "error", err)
		return
	}
	b.PublishMsg(msg)
}

// PublishMsg queues an event already encoded (events.Encode), for a publisher that
// sets its own Meta: an id shared by the replicas that may send the same event, so
// the stream keeps one. It never blocks; the full queue drops and counts it.
func (b *Outbox) PublishMsg(msg *nats.Msg) {
	select {
	case b.q <- msg:
	default:
		b.dropped.Inc()
		b.o.Log.Warn("event queue full, event dropped", "subject", msg.Subject)
	}
}

// Run publishes queued events until ctx ends, then keeps publishing what is queued
// for up to Flush more (a service queues its last event, e.g. pod.down, just
// before it stops). It returns nil.
func (b *Outbox) Run(ctx context.Context) error {
	// hard ends every publish, including one in progress, Flush after ctx ends.
	hard, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := b.o.Clock.NewTimer(b.o.Flush)
		go func() {
			defer t.Stop()
			select {
			case <-t.C():
				cancel()
			case <-hard.Done():
			}
		}()
	})
	defer stop()
	for {
		select {
		case msg := <-b.q:
			b.send(hard, msg)
		case <-ctx.Done():
			for {
				select {
				case msg := <-b.q:
					if hard.Err() != nil {
						// Out of time: what is left is not published.
						b.dropped.Add(float64(1 + len(b.q)))
						return nil
					}
					b.send(hard, msg)
				default:
					return nil
				}
			}
		}
	}
}

// send publishes msg with bus.Publisher, which holds on to it (and so to the
// queue behind it) for as long as the stream is unavailable for a while (no
// stream leader, JetStream starting, the bus reconnecting: bus.Transient), until
// ctx ends. The event id is the JetStream dedup id, so an attempt that did reach
// the stream before its ack was lost is not stored twice. Only an event the bus
// refuses for good, or one still unsent when ctx ends, is dropped and counted.
func (b *Outbox) send(ctx context.Context, msg *nats.Msg) {
	var waited bool
	pub := bus.Publisher{JS: b.js, Clock: b.o.Clock, Retryable: bus.Transient, Retrying: func(err error) {
		if !waited {
			waited = true
			b.o.Log.Warn("event stream unavailable, holding events until it is back", "queued", len(b.q)+1, "error", err)
		}
	}}
	if err := pub.Publish(ctx, msg); err != nil {
		b.dropped.Inc()
		b.o.Log.Warn("event not published", "subject", msg.Subject, "error", err)
		return
	}
	if waited {
		b.o.Log.Info("event stream back, publishing the held events", "queued", len(b.q))
	}
}
