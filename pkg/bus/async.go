package bus

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
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
// connection receives every ack, and one goroutine (run) times every event's
// current wait on the publisher's clock.
type AsyncPublisher struct {
	nc  *nats.Conn
	clk clock.Clock

	mu      sync.Mutex
	inbox   string // <inbox>. ; "" until Start
	sub     *nats.Subscription
	pending map[string]*asyncEvent
	due     dueQueue      // the pending events by the end of their current wait
	wake    chan struct{} // the earliest wait changed
	quit    chan struct{} // closed by Stop
	next    uint64
	stopped bool
}

type asyncEvent struct {
	token    string
	msg      *nats.Msg
	deadline time.Time
	retries  *backoff.Backoff
	at       time.Time // when the current wait ends
	resend   bool      // at at: send again (a backoff ended); else the attempt's ack is late
	idx      int       // in due; -1 when not there
	done     func(error)
}

// asyncRetry is the wait before an event is sent again (no stream leader yet, no
// ack in time).
var asyncRetry = backoff.Policy{First: 50 * time.Millisecond, Max: time.Second}

// ErrPublisherStopped is what an event published after Stop is done with.
var ErrPublisherStopped = errors.New("async publisher stopped")

// NewAsyncPublisher returns a publisher on nc whose waits are clk's; Start
// subscribes.
func NewAsyncPublisher(nc *nats.Conn, clk clock.Clock) *AsyncPublisher {
	return &AsyncPublisher{nc: nc, clk: clk, pending: map[string]*asyncEvent{}, wake: make(chan struct{}, 1)}
}

// Start subscribes to the acks' inbox and starts the goroutine that times the
// attempts.
func (p *AsyncPublisher) Start() error {
	inbox := p.nc.NewInbox() + "."
	sub, err := p.nc.Subscribe(inbox+"*", p.ack)
	if err != nil {
		return fmt.Errorf("async publisher: %w", err)
	}
	quit := make(chan struct{})
	p.mu.Lock()
	p.inbox, p.sub, p.quit = inbox, sub, quit
	p.mu.Unlock()
	go p.run(quit)
	return nil
}

// Stop ends every event still waiting with ErrPublisherStopped and unsubscribes;
// later events end so at once. Call it once nothing waits on an event any more.
func (p *AsyncPublisher) Stop() {
	p.mu.Lock()
	p.stopped = true
	left := p.pending
	p.pending = map[string]*asyncEvent{}
	p.due = nil
	sub, quit := p.sub, p.quit
	p.quit = nil
	p.mu.Unlock()
	if quit != nil {
		close(quit)
	}
	for _, e := range left {
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
	e := &asyncEvent{msg: msg, deadline: deadline, retries: asyncRetry.Start(), idx: -1, done: done}
	p.mu.Lock()
	if p.stopped || p.inbox == "" {
		p.mu.Unlock()
		done(ErrPublisherStopped)
		return
	}
	p.next++
	e.token = strconv.FormatUint(p.next, 36)
	msg.Reply = p.inbox + e.token
	p.pending[e.token] = e
	p.awaitAck(e)
	p.mu.Unlock()
	p.send(e)
}

// awaitAck gives e's attempt PublishAttempt (at most until its deadline) for its
// ack. p.mu is held.
func (p *AsyncPublisher) awaitAck(e *asyncEvent) {
	now := p.clk.Now()
	p.schedule(e, now.Add(min(PublishAttempt, e.deadline.Sub(now))), false)
}

// send sends e's attempt; a connection that cannot send it ends e.
func (p *AsyncPublisher) send(e *asyncEvent) {
	if err := p.nc.PublishMsg(e.msg); err != nil && !errors.Is(err, nats.ErrConnectionReconnecting) {
		p.finish(e.token, fmt.Errorf("publish %s: %w", e.msg.Subject, err))
	}
}

// take removes and returns token's event, nil when it is done already.
func (p *AsyncPublisher) take(token string) *asyncEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.pending[token]
	delete(p.pending, token)
	if e != nil && e.idx >= 0 {
		heap.Remove(&p.due, e.idx)
	}
	return e
}

func (p *AsyncPublisher) finish(token string, err error) {
	if e := p.take(token); e != nil {
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
	at := p.clk.Now().Add(e.retries.Next())
	if !at.After(e.deadline) {
		p.schedule(e, at, true)
		p.mu.Unlock()
		return
	}
	delete(p.pending, token)
	if e.idx >= 0 {
		heap.Remove(&p.due, e.idx)
	}
	p.mu.Unlock()
	e.done(fmt.Errorf("publish %s: not stored by its deadline: %w", e.msg.Subject, err))
}

// schedule makes e's current wait end at at, then resending it or, if not
// resend, retrying it for want of an ack. p.mu is held.
func (p *AsyncPublisher) schedule(e *asyncEvent, at time.Time, resend bool) {
	e.at, e.resend = at, resend
	if e.idx >= 0 {
		heap.Fix(&p.due, e.idx)
	} else {
		heap.Push(&p.due, e)
	}
	if e.idx == 0 {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// run ends every event's wait when it is due, until quit is closed.
func (p *AsyncPublisher) run(quit <-chan struct{}) {
	t := p.clk.NewTimer(time.Hour)
	defer t.Stop()
	for {
		p.mu.Lock()
		now := p.clk.Now()
		var due []*asyncEvent
		for len(p.due) > 0 && !p.due[0].at.After(now) {
			due = append(due, heap.Pop(&p.due).(*asyncEvent))
		}
		next := time.Duration(-1)
		if len(p.due) > 0 {
			next = p.due[0].at.Sub(now)
		}
		p.mu.Unlock()
		for _, e := range due {
			p.fire(e)
		}
		if len(due) > 0 {
			continue // firing scheduled new waits: look again
		}
		if next >= 0 {
			t.Reset(next)
		} else {
			t.Stop()
		}
		select {
		case <-quit:
			return
		case <-p.wake:
		case <-t.C():
		}
	}
}

// fire acts on e's wait that ended, unless e is done or waits anew since.
func (p *AsyncPublisher) fire(e *asyncEvent) {
	p.mu.Lock()
	if p.pending[e.token] != e || e.idx >= 0 {
		p.mu.Unlock()
		return
	}
	if !e.resend {
		p.mu.Unlock()
		p.retry(e.token, nats.ErrTimeout)
		return
	}
	p.awaitAck(e)
	p.mu.Unlock()
	p.send(e)
}

// dueQueue is a heap of events by the end of their current wait.
type dueQueue []*asyncEvent

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q dueQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx, q[j].idx = i, j
}
func (q *dueQueue) Push(x any) {
	e := x.(*asyncEvent)
	e.idx = len(*q)
	*q = append(*q, e)
}
func (q *dueQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.idx = -1
	*q = old[:len(old)-1]
	return e
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
