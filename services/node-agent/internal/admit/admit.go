// Package admit is the node agent's auth callout: it admits a pod to the node's
// leaf server by the pod's own service-account token, and only a pod that the
// token binds to this node, with the pod's own subjects and its node sign
// subject (policy.ForNodePod). The hub never sees the pod's connection.
package admit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// Pod is what a verified token says of the pod presenting it.
type Pod struct {
	Pod     events.PodRef // the kubernetes.io.pod claim, in the token's namespace
	Node    string        // the kubernetes.io.node.name claim
	Expires time.Time     // the token's exp
}

// Verifier verifies a pod's service-account token (signature, issuer, audience,
// expiry) and says what it binds.
type Verifier interface {
	VerifyPod(token string) (Pod, error)
}

// Tokens verifies pods' tokens with an authn verifier (a JWKS or TokenReview).
type Tokens struct{ Verifier authn.TokenVerifier }

var _ Verifier = Tokens{}

// VerifyPod verifies token and reads its pod and node claims.
func (t Tokens) VerifyPod(token string) (Pod, error) {
	if err := t.Verifier.Ready(); err != nil {
		return Pod{}, fmt.Errorf("not ready to verify tokens: %w", err)
	}
	c, err := t.Verifier.Verify(token)
	if err != nil {
		return Pod{}, err
	}
	return Pod{Pod: c.Pod, Node: c.Node, Expires: c.Expires}, nil
}

// Callout admits the node's pods.
type Callout struct {
	node   string
	issuer nkeys.KeyPair
	verify Verifier
	limits policy.PodLimits
	clk    clock.Clock
	log    hclog.Logger

	admitted prometheus.Counter
	refused  *prometheus.CounterVec
	dropped  prometheus.Counter
	// serverWait is how long the leaf server waits for an answer (its auth timeout).
	serverWait time.Duration
}

// New returns the callout of node, signing users with issuer (the leaf server's
// callout issuer) and verifying tokens with v; the server waits serverWait for
// each answer.
func New(node string, issuer nkeys.KeyPair, v Verifier, limits policy.PodLimits, serverWait time.Duration, clk clock.Clock, log hclog.Logger, reg prometheus.Registerer) *Callout {
	c := &Callout{node: node, issuer: issuer, verify: v, limits: limits.WithDefaults(), serverWait: serverWait, clk: clk, log: log,
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_node_callout_dropped_total",
			Help: "Connect requests dropped unanswered: the leaf server had stopped waiting for them, or the queue was full (the client connects again)."}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_node_admissions_total",
			Help: "Pods admitted to this node's leaf server."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_node_refusals_total",
			Help: "Connections refused by this node's callout, by reason."}, []string{"reason"}),
	}
	reg.MustRegister(c.admitted, c.refused, c.dropped)
	return c
}

// Refusal reasons (the reason label).
const (
	ReasonToken   = "token"    // no token, or one that does not verify
	ReasonNoPod   = "no_pod"   // a token bound to no pod
	ReasonNode    = "node"     // a pod of another node (or a token naming no node)
	ReasonRequest = "request"  // the server's request did not decode
	ReasonAnswer  = "internal" // the answer could not be signed
)

// Answer decides one connect request of the leaf server.
func (c *Callout) Answer(data []byte) ([]byte, error) {
	req, err := policy.DecodeAuthRequest(data)
	if err != nil {
		c.refused.WithLabelValues(ReasonRequest).Inc()
		return nil, err
	}
	return c.answer(req)
}

func (c *Callout) answer(req *jwt.AuthorizationRequestClaims) ([]byte, error) {
	pod, reason, err := c.check(req.ConnectOptions.Token)
	if err != nil {
		c.refused.WithLabelValues(reason).Inc()
		c.log.Debug("pod refused", "reason", reason, "error", err)
		return policy.Refuse(c.issuer, req, err.Error())
	}
	expires := c.limits.Expiry(c.clk.Now(), pod.Expires, rand.Float64())
	resp, err := policy.AdmitNodePod(c.issuer, req, c.node, pod.Pod, expires, c.limits)
	if err != nil {
		c.refused.WithLabelValues(ReasonAnswer).Inc()
		return policy.Refuse(c.issuer, req, err.Error())
	}
	c.admitted.Inc()
	return resp, nil
}

// check verifies token and that it binds a pod scheduled on this node.
func (c *Callout) check(token string) (Pod, string, error) {
	if token == "" {
		return Pod{}, ReasonToken, errors.New("no token")
	}
	pod, err := c.verify.VerifyPod(token)
	if err != nil {
		return Pod{}, ReasonToken, err
	}
	if pod.Pod.IsZero() {
		return Pod{}, ReasonNoPod, errors.New("token bound to no pod: the node tier admits pods by their pod-bound token")
	}
	if pod.Node != c.node {
		return Pod{}, ReasonNode, fmt.Errorf("pod %s is bound to node %q, not to this node %q", pod.Pod, pod.Node, c.node)
	}
	return pod, "", nil
}

// Serve answers the leaf server's callout requests on nc (connected as the leaf's
// callout user) until ctx ends, with workers checking tokens at once (one per
// core): a node whose pods all start together (a node restart) admits them at
// the speed of its cores, not of one. A request that waited past the server's
// wait for it is dropped unanswered, never admitted for a client already gone.
func (c *Callout) Serve(ctx context.Context, nc *nats.Conn) error {
	queue := make(chan *nats.Msg, queueLen)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range queue {
				c.serve(m)
			}
		}()
	}
	defer func() { close(queue); wg.Wait() }()
	sub, err := nc.Subscribe(policy.AuthCalloutSubject, func(m *nats.Msg) {
		select {
		case queue <- m:
		default: // the server times the client out; it connects again later
			c.dropped.Inc()
		}
	})
	if err != nil {
		return fmt.Errorf("node callout: subscribe: %w", err)
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("node callout: %w", err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	return nil
}

// queueLen bounds the connect requests waiting for a worker: a node's pods,
// several times over.
const queueLen = 8192

// serve answers one request, unless the server has stopped waiting for it.
func (c *Callout) serve(m *nats.Msg) {
	req, err := policy.DecodeAuthRequest(m.Data)
	if err != nil {
		c.refused.WithLabelValues(ReasonRequest).Inc()
		c.log.Warn("callout request dropped", "error", err)
		return
	}
	// The leaf server runs in this process, on this clock: its wait for the answer
	// started at the request's issue time (whole seconds, so a second is kept
	// in hand).
	if !c.clk.Now().Before(time.Unix(req.IssuedAt, 0).Add(c.serverWait - time.Second)) {
		c.dropped.Inc()
		return
	}
	resp, err := c.answer(req)
	if err != nil {
		c.log.Warn("callout answer failed", "error", err)
		return
	}
	if err := m.Respond(resp); err != nil {
		c.log.Warn("callout answer not sent", "error", err)
	}
}
