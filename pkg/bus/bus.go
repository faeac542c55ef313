// Package bus connects services to the NATS bus. Every service connects through
// Connect, so securing the bus (credentials, TLS) is configuration, not code.
package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats.go"
)

// PingInterval is how often a connection pings the server; two unanswered pings
// end it (and start reconnecting).
const PingInterval = 5 * time.Second

// NodeLocalPingInterval is PingInterval for a pod's connection to its own node's
// agent (Config.NodeLocal), nats' default. The fast pings are there to find a
// dead connection to a server across the network and reconnect to another; a pod
// of the node tier has one server, on its own node, which it cannot fail over
// from, and whose restart closes the socket. At 5 s, a node busy admitting its
// pods (a node restart, a fleet storm) answered pings late, its pods took their
// connections for dead and reconnected, and each reconnect was admitted again:
// in a 100,000-pod storm 60,032 connections ended that way (docs/scale.md).
const NodeLocalPingInterval = 2 * time.Minute

// NodeLocalConnectTimeout is ConnectTimeout for a pod's connection to its own
// node's agent (Config.NodeLocal): above the leaf server's auth timeout
// (embedded.LeafAuthTimeout), so that a pod waits for a busy node as long as the
// node waits for it. There is no other server to try, and a pod that gave up
// only came back to the end of the same node's queue: in a 100,000-pod storm
// on one machine, 97,000 connects were retried after a dial or handshake
// timed out at 10 s (docs/scale.md, "Admission inside the leaf server").
const NodeLocalConnectTimeout = time.Minute

// ConnectTimeout bounds one connection attempt (dial, TLS, and the server's answer
// to the credential). It is above the server's auth timeout (policy.AuthTimeout),
// so that a client waits as long as the server waits for the auth callout: never
// does the callout admit a client that has already given up.
const ConnectTimeout = 10 * time.Second

// Reconnect is the schedule of waits between reconnect attempts: a wave of
// clients that lost the bus together (a server restart, users expiring together,
// a callout shedding load) comes back spread over time instead of at once.
var Reconnect = backoff.Policy{First: 250 * time.Millisecond, Max: 4 * time.Second, Jitter: 0.75}

// UrgentReconnect is Reconnect while the process says its need is urgent (SetUrgent):
// a pod whose certificate is about to expire, or has, with the bus its only way to a
// CA, must be back within a second of the network (issue 10: served again within 2 s
// of the CA being back; pilot-agent 1.1 s), where Reconnect's waits add up to 4 s. A
// cold start is never urgent (no certificate yet), so a storm keeps Reconnect's spread.
var UrgentReconnect = backoff.Policy{First: 250 * time.Millisecond, Max: time.Second, Jitter: 0.75}

// urgent is SetUrgent's flag: one per process, which is one pod (or one service).
var urgent atomic.Bool

// SetUrgent says whether this process needs the bus back urgently: while true, every
// connection of the process waits on UrgentReconnect's schedule between reconnect
// attempts instead of Reconnect's. A wait already begun is not cut short.
func SetUrgent(on bool) { urgent.Store(on) }

// Urgent reports SetUrgent's last word.
func Urgent() bool { return urgent.Load() }

// waitReport is how often Connect says at INFO that it is still waiting for the bus.
const waitReport = 10 * time.Second

// Connect dials the bus. It retries the initial connection for up to c.ConnectWait
// (or, with c.Background, returns at once and keeps trying in the background) and
// then reconnects forever; connection changes are logged on log.
func Connect(ctx context.Context, c Config, log hclog.Logger) (*nats.Conn, error) {
	opts, err := c.options(log)
	if err != nil {
		return nil, err
	}
	if c.Background {
		return connectInBackground(c, opts, log)
	}
	clk := c.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	began := clk.Now()
	var reported time.Time
	retry := Reconnect.Start()
	for {
		nc, err := nats.Connect(c.URL, opts...)
		if err == nil {
			if !reported.IsZero() {
				log.Info("nats connected", "url", nc.ConnectedUrlRedacted(), "after", clk.Now().Sub(began).Round(time.Millisecond))
			} else {
				log.Debug("nats connected", "url", nc.ConnectedUrlRedacted())
			}
			return nc, nil
		}
		if c.ConnectWait > 0 && clk.Now().Sub(began) > c.ConnectWait {
			return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, err)
		}
		if c.Waiting != nil {
			c.Waiting(err)
		}
		if now := clk.Now(); now.Sub(reported) >= waitReport {
			// At the default level: a pod the bus refuses (its auth callout down)
			// must say what it waits for.
			log.Info("waiting for the bus", "url", c.URL, "waited", now.Sub(began).Round(time.Second), "error", err)
			reported = now
		} else {
			log.Debug("nats not reachable yet", "url", c.URL, "error", err)
		}
		if !backoff.Wait(ctx, clk, retry.Next()) {
			return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, ctx.Err())
		}
	}
}

// connectInBackground connects with nats' RetryOnFailedConnect: it returns at once
// and the connection keeps trying (c.Background).
func connectInBackground(c Config, opts []nats.Option, log hclog.Logger) (*nats.Conn, error) {
	// The first connect after a failed one calls the connect handler, not the
	// reconnect handler: forward it, so that callers hear of it one way.
	nc, err := nats.Connect(c.URL, append(opts, nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(nc *nats.Conn) {
			if cb := nc.ReconnectHandler(); cb != nil {
				cb(nc)
			}
		}))...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, err)
	}
	if !nc.IsConnected() {
		log.Info("nats not reachable yet, connecting in the background", "url", c.URL)
	}
	return nc, nil
}

func (c Config) connectTimeout() time.Duration {
	if c.NodeLocal {
		return NodeLocalConnectTimeout
	}
	return ConnectTimeout
}

func (c Config) pingInterval() time.Duration {
	if c.NodeLocal {
		return NodeLocalPingInterval
	}
	return PingInterval
}

// options are the connect options of c: reconnecting forever on Reconnect's
// schedule, pings, bounded drain, logged connection changes, the credential and TLS.
func (c Config) options(log hclog.Logger) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.Timeout(c.connectTimeout()),
		nats.CustomReconnectDelay(reconnectDelay),
		// A connection cut without a FIN (a partition, a network detached) looks
		// alive until pings go unanswered: with nats' default of 2 minutes a pod
		// cut off for 90 s never notices, keeps sending requests into a dead
		// socket, and does not reconnect (and retry at once) when the network is
		// back. 5 s pings, 2 unanswered: a dead connection is found in 10-15 s.
		nats.PingInterval(c.pingInterval()),
		nats.MaxPingsOutstanding(2),
		nats.RetryOnFailedConnect(false),
		nats.DrainTimeout(5 * time.Second), // shutdown stays bounded
		// A pod's bus user expires with its token; keep reconnecting (with the token
		// file re-read) instead of giving up after the same auth error twice.
		nats.IgnoreAuthErrorAbort(),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			if LateReply(err) {
				lateReplies.Add(1)
				log.Info("late reply dropped by the server: its requester's response window had closed", "error", err)
				return
			}
			log.Error("nats async error", "subject", subj, "error", err)
		}),
	}
	auth, err := c.authOptions(log)
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	if c.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.TLS.CAFile))
	}
	if c.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
	}
	if c.TLS.ClientCert != nil {
		opts = append(opts, presentCert(c.TLS.ClientCert, log))
	}
	return opts, nil
}

// lateReplies counts LateReply errors on every connection of the process.
var lateReplies atomic.Uint64

// LateReplies counts the replies the server refused because the requester's
// response window (allow_responses) had closed: a responder that resumed from a
// freeze answering requests their requesters gave up on. Expected, not an error.
func LateReplies() uint64 { return lateReplies.Load() }

// LateReply reports whether err is the server refusing a publish into an inbox
// (_INBOX.): under allow_responses that is a reply sent after its window closed.
// nats.go reports it only as ErrPermissionViolation with the server's text.
func LateReply(err error) bool {
	return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `for Publish to "_INBOX.`)
}

// reconnectDelay is the wait before a connection's attempt-th reconnect pass
// (attempt 1 after the loss): Reconnect's schedule, jittered.
func reconnectDelay(attempt int) time.Duration {
	p := Reconnect
	if urgent.Load() {
		p = UrgentReconnect
	}
	b := p.Start()
	for i := 1; i < attempt && b.Current() < p.Max; i++ {
		b.Next()
	}
	return p.Apply(b.Current())
}

// Drain drains nc (its subscriptions finish what they hold, its pending
// publishes are flushed) and waits until it is closed: at most the drain timeout
// Connect sets, so a stopping service never leaves its connection behind.
func Drain(nc *nats.Conn) {
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil || nc.IsClosed() {
		nc.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case <-closed:
	case <-ctx.Done():
		nc.Close()
	}
}
