package buscallout

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// Capacity bounds the work the callout takes on at once. A connect request waits in
// a queue of Queue requests for one of Workers; when the queue is full the request is
// refused at once as busy (ReasonBusy: the client reconnects after its jittered
// backoff), instead of waiting until the server gives up on it, and a request the
// server stopped waiting for before a worker reached it is dropped unanswered:
// admitting a client that has gone is work that only feeds a storm.
type Capacity struct {
	Workers int
	Queue   int
	// TokenCache is how many verified tokens are kept (by hash) for a pod's other
	// connections, each at most TokenCacheTTL and never past its expiry.
	TokenCache    int
	TokenCacheTTL time.Duration
}

// Defaults of Capacity.
const (
	// DefaultQueue: at ~0.3 ms of CPU per admission, a full queue is drained in well
	// under the server's auth timeout (policy.AuthTimeout) by one core.
	DefaultQueue         = 1024
	DefaultTokenCache    = 16384
	DefaultTokenCacheTTL = 30 * time.Second
)

// DefaultCapacity is two workers per core (a TokenReview waits on the API server).
func DefaultCapacity() Capacity {
	return Capacity{Workers: 2 * runtime.GOMAXPROCS(0), Queue: DefaultQueue, TokenCache: DefaultTokenCache, TokenCacheTTL: DefaultTokenCacheTTL}
}

// WithDefaults is c with its zero fields set to the defaults.
func (c Capacity) WithDefaults() Capacity {
	d := DefaultCapacity()
	if c.Workers <= 0 {
		c.Workers = d.Workers
	}
	if c.Queue <= 0 {
		c.Queue = d.Queue
	}
	if c.TokenCache <= 0 {
		c.TokenCache = d.TokenCache
	}
	if c.TokenCacheTTL <= 0 {
		c.TokenCacheTTL = d.TokenCacheTTL
	}
	return c
}

// ReasonBusy: the callout's queue was full; the client reconnects later.
const ReasonBusy = "busy_try_later"

// errGaveUp: the server stopped waiting for the answer (its auth timeout passed).
var errGaveUp = errors.New("the server stopped waiting for this connect request")

// pending is a connect request and when it arrived.
type pending struct {
	msg      *nats.Msg
	received time.Time
}

// enqueue is the subscription's handler: it hands the request to a worker or, when
// every worker is taken and the queue is full, to the shedder, which refuses it as
// busy. It does nothing else, so that requests never wait in the subscription
// behind work: their arrival time, from which their deadline is counted, is when
// the bus delivered them. When the shedder is behind too the request is dropped
// (the server times it out; the client retries after its backoff).
func (r *Responder) enqueue(m *nats.Msg) {
	select {
	case r.queue <- pending{msg: m, received: r.now()}:
		return
	default:
	}
	select {
	case r.shedding <- m:
	default:
		r.dropped.Inc()
	}
}

// shed refuses a request at once: the server closes the connection and the client
// tries again after its backoff, rather than waiting out the auth timeout.
func (r *Responder) shed(m *nats.Msg) {
	req, err := policy.DecodeAuthRequest(m.Data)
	if err != nil {
		r.refused.WithLabelValues(ReasonMalformed).Inc()
		return
	}
	r.refused.WithLabelValues(ReasonBusy).Inc()
	resp, err := policy.Refuse(r.issuer, req, ReasonBusy)
	if err != nil {
		r.log.Error("bus auth response failed", "error", err)
		return
	}
	if err := m.Respond(resp); err != nil {
		r.log.Debug("bus auth response not sent", "error", err)
	}
}

// work runs the workers and the shedder until ctx ends.
func (r *Responder) work(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { drain(ctx, r.shedding, r.shed) })
	for range r.capacity.Workers {
		wg.Go(func() { drain(ctx, r.queue, r.serve) })
	}
	wg.Wait()
}

// drain hands each value from c to handle until ctx ends.
func drain[T any](ctx context.Context, c <-chan T, handle func(T)) {
	for {
		select {
		case <-ctx.Done():
			return
		case v := <-c:
			handle(v)
		}
	}
}

// deadline is when the server stops waiting for the answer to req, on this
// signer's clock: the request's own lifetime (its expiry less its issue time, the
// server's auth timeout in whole seconds) counted from its arrival, less a second
// for the rounding down of both to seconds (at least half a second). Counting from
// the arrival keeps a skew between the server's clock and the signer's out of it.
// Zero: no deadline.
func deadline(req *jwt.AuthorizationRequestClaims, received time.Time) time.Time {
	if req.Expires == 0 || req.IssuedAt == 0 || req.Expires <= req.IssuedAt {
		return time.Time{}
	}
	life := max(time.Duration(req.Expires-req.IssuedAt)*time.Second-time.Second, 500*time.Millisecond)
	return received.Add(life)
}

// TokenSpread is the part of a credential's life, at its end, over which the users
// of pods admitted with credentials that expire together are spread: each pod's
// user expires at its own point in it, so that tokens minted together (a deploy)
// never drop their pods at once. The kubelet refreshes a projected token at 80% of
// its life, so a pod re-admitted in the last 15% finds a fresh token in its file.
const TokenSpread = 0.15

// userExpiry is when the user of pod, admitted at now with caller's credential,
// expires: the lifetime cap (jittered) when it comes first; else a point in the
// credential's last TokenSpread of life that is the pod's own (from a hash of the
// pod and the credential's expiry: the same pod with the same credential gets the
// same point, so a reconnect after it is admitted until the credential's expiry,
// not jittered again and again toward it).
func (r *Responder) userExpiry(now time.Time, caller authn.Caller) time.Time {
	exp := r.limits.Expiry(now, caller.Expires, r.jitter())
	if exp.Before(caller.Expires) {
		return exp
	}
	window := r.limits.Lifetime
	if !caller.Issued.IsZero() && caller.Issued.Before(caller.Expires) {
		window = min(window, caller.Expires.Sub(caller.Issued))
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", caller.Pod, caller.Expires.UnixNano()))
	u := float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53) // in [0, 1)
	point := caller.Expires.Add(-time.Duration(float64(window) * TokenSpread * u))
	if point.After(now) {
		return point
	}
	return caller.Expires
}
