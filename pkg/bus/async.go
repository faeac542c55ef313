package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// AsyncPublisher stores events in JetStream like Publish, with the same attempts,
// retries and dedup id, but calls back when the stream has acknowledged an event
// instead of holding a goroutine until it does: the callback runs on the
// goroutine that reads the acks, so a service that answers a request once its
// event is stored (the signer's reply after cert.issued) answers from there, and
// the goroutine that asked is free at once. One subscription on an inbox of the
// connection receives every ack.
type AsyncPublisher struct {
	nc *nats.Conn

	mu      sync.Mutex
	inbox   string // <inbox>. ; "" until Start
	sub     *nats.Subscription
	pending map[string]*asyncEvent
	next    uint64
	stopped bool
}

type asyncEvent struct {
	msg      *nats.Msg
	deadline time.Time
	retries  *backoff.Backoff
	timer    *time.Timer // the current attempt's
	done     func(error)
}

// asyncRetry is the wait before an event is sent again (no stream leader yet, no
// ack in time).
var asyncRetry = backoff.Policy{First: 50 * time.Millisecond, Max: time.Second}

// ErrPublisherStopped is what an event published after Stop is done with.
var ErrPublisherStopped = errors.New("async publisher stopped")

// NewAsyncPublisher returns a publisher on nc; Start subscribes.
func NewAsyncPublisher(nc *nats.Conn) *AsyncPublisher {
	return &AsyncPublisher{nc: nc, pending: map[string]*asyncEvent{}}
}

// Start subscribes to the acks' inbox.
func (p *AsyncPublisher) Start() error {
	inbox := p.nc.NewInbox() + "."
	sub, err := p.nc.Subscribe(inbox+"*", p.ack)
	if err != nil {
		return fmt.Errorf("async publisher: %w", err)
	}
	p.mu.Lock()
	p.inbox, p.sub = inbox, sub
	p.mu.Unlock()
	return nil
}

// Stop ends every event still waiting with ErrPublisherStopped and unsubscribes;
// later events end so at once. Call it once nothing waits on an event any more.
func (p *AsyncPublisher) Stop() {
	p.mu.Lock()
	p.stopped = true
	left := p.pending
	p.pending = map[string]*asyncEvent{}
	sub := p.sub
	p.mu.Unlock()
	for _, e := range left {
		e.timer.Stop()
		e.done(ErrPublisherStopped)
	}
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// Pending is how many events wait for their ack.
func (p *AsyncPublisher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// Publish stores msg (an event whose ce-id becomes its dedup id) and calls done
// exactly once: with nil when the stream has acknowledged it, or with why it could
// not be stored by deadline (a stream without a leader is retried, each attempt
// waiting PublishAttempt for its ack, as Publish does). msg is sent as is: the
// caller must not touch it afterwards.
func (p *AsyncPublisher) Publish(msg *nats.Msg, deadline time.Time, done func(error)) {
	msg.Header.Set(jetstream.MsgIDHeader, msg.Header.Get(events.HeaderID))
	e := &asyncEvent{msg: msg, deadline: deadline, retries: asyncRetry.Start(), done: done}
	p.mu.Lock()
	if p.stopped || p.inbox == "" {
		p.mu.Unlock()
		done(ErrPublisherStopped)
		return
	}
	p.next++
	token := strconv.FormatUint(p.next, 36)
	msg.Reply = p.inbox + token
	p.pending[token] = e
	e.timer = time.AfterFunc(min(PublishAttempt, time.Until(deadline)), func() { p.retry(token, nats.ErrTimeout) })
	p.mu.Unlock()
	if err := p.nc.PublishMsg(msg); err != nil && !errors.Is(err, nats.ErrConnectionReconnecting) {
		p.finish(token, fmt.Errorf("publish %s: %w", msg.Subject, err))
	}
}

// take removes and returns token's event, nil when it is done already.
func (p *AsyncPublisher) take(token string) *asyncEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.pending[token]
	delete(p.pending, token)
	return e
}

func (p *AsyncPublisher) finish(token string, err error) {
	if e := p.take(token); e != nil {
		e.timer.Stop()
		e.done(err)
	}
}

// retry sends token's event again after its backoff, unless that would pass its
// deadline: then it is done with err.
func (p *AsyncPublisher) retry(token string, err error) {
	p.mu.Lock()
	e := p.pending[token]
	if e == nil {
		p.mu.Unlock()
		return
	}
	e.timer.Stop()
	wait := e.retries.Next()
	if time.Now().Add(wait).After(e.deadline) {
		delete(p.pending, token)
		p.mu.Unlock()
		e.done(fmt.Errorf("publish %s: not stored by its deadline: %w", e.msg.Subject, err))
		return
	}
	e.timer = time.AfterFunc(wait, func() {
		p.mu.Lock()
		if p.pending[token] != e {
			p.mu.Unlock()
			return
		}
		e.timer = time.AfterFunc(min(PublishAttempt, time.Until(e.deadline)), func() { p.retry(token, nats.ErrTimeout) })
		p.mu.Unlock()
		if err := p.nc.PublishMsg(e.msg); err != nil && !errors.Is(err, nats.ErrConnectionReconnecting) {
			p.finish(token, fmt.Errorf("publish %s: %w", e.msg.Subject, err))
		}
	})
	p.mu.Unlock()
}

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Error  *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// ack handles one answer on the inbox: no responders (no stream leader yet) is
// retried; an ack ends its event, with the stream's error if it refused it.
func (p *AsyncPublisher) ack(m *nats.Msg) {
	p.mu.Lock()
	inbox := p.inbox
	p.mu.Unlock()
	token := m.Subject[min(len(inbox), len(m.Subject)):]
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		p.retry(token, nats.ErrNoResponders)
		return
	}
	var a pubAck
	if err := json.Unmarshal(m.Data, &a); err != nil {
		p.finish(token, fmt.Errorf("publish ack: %w", err))
		return
	}
	if a.Error != nil {
		p.finish(token, fmt.Errorf("publish: stream refused the event: %s (code %d, error %d)", a.Error.Description, a.Error.Code, a.Error.ErrCode))
		return
	}
	if a.Stream == "" {
		p.finish(token, errors.New("publish ack names no stream"))
		return
	}
	p.finish(token, nil)
}
