// Package admit is the node agent's admission of pods: it admits a pod to the
// node's leaf server by the pod's own service-account token, and only a pod that
// the token binds to this node, with the pod's own subjects and its node sign
// subject (policy.ForNodePod). It runs inside the leaf server, on the connecting
// pod's goroutine (embedded.Leaf.Admit), not as an auth callout. The hub never
// sees the pod's connection.
package admit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
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

// Admission admits the node's pods.
type Admission struct {
	node   string
	verify Verifier
	limits policy.PodLimits
	clk    clock.Clock
	log    hclog.Logger

	admitted prometheus.Counter
	refused  *prometheus.CounterVec
}

// New returns the admission of node's pods, verifying their tokens with v.
func New(node string, v Verifier, limits policy.PodLimits, clk clock.Clock, log hclog.Logger, reg prometheus.Registerer) *Admission {
	a := &Admission{node: node, verify: v, limits: limits.WithDefaults(), clk: clk, log: log,
		admitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_node_admissions_total",
			Help: "Pods admitted to this node's leaf server."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_node_refusals_total",
			Help: "Connections refused by this node's admission, by reason."}, []string{"reason"}),
	}
	reg.MustRegister(a.admitted, a.refused)
	return a
}

// Refusal reasons (the reason label).
const (
	ReasonToken  = "token"    // no token, or one that does not verify
	ReasonNoPod  = "no_pod"   // a token bound to no pod
	ReasonNode   = "node"     // a pod of another node (or a token naming no node)
	ReasonExpiry = "expired"  // a credential that expires before the user would start
	ReasonAnswer = "internal" // the pod's permissions could not be made
)

// Admit decides one connection of the leaf server (embedded.LeafAdmit): the pod
// its token binds to this node, with that pod's permissions, until its token
// expires or sooner (policy.PodLimits.Expiry).
func (a *Admission) Admit(c embedded.LeafClient) (embedded.LeafUser, error) {
	pod, reason, err := a.check(c.Token)
	if err == nil {
		var u embedded.LeafUser
		if u, reason, err = a.user(pod); err == nil {
			a.admitted.Inc()
			return u, nil
		}
	}
	a.refused.WithLabelValues(reason).Inc()
	a.log.Debug("pod refused", "reason", reason, "remote", c.Remote, "error", err)
	return embedded.LeafUser{}, err
}

func (a *Admission) user(pod Pod) (embedded.LeafUser, string, error) {
	now := a.clk.Now()
	expires := a.limits.Expiry(now, pod.Expires, rand.Float64())
	if !expires.After(now) {
		return embedded.LeafUser{}, ReasonExpiry, fmt.Errorf("credential already expired at %s", expires.UTC().Format(time.RFC3339))
	}
	p, err := policy.ForNodePod(a.node, pod.Pod)
	if err != nil {
		return embedded.LeafUser{}, ReasonAnswer, err
	}
	return embedded.LeafUser{Name: "pod/" + pod.Pod.String(), Permissions: p, Expires: expires}, "", nil
}

// check verifies token and that it binds a pod scheduled on this node.
func (a *Admission) check(token string) (Pod, string, error) {
	if token == "" {
		return Pod{}, ReasonToken, errors.New("no token")
	}
	pod, err := a.verify.VerifyPod(token)
	if err != nil {
		return Pod{}, ReasonToken, err
	}
	if pod.Pod.IsZero() {
		return Pod{}, ReasonNoPod, errors.New("token bound to no pod: the node tier admits pods by their pod-bound token")
	}
	if pod.Node != a.node {
		return Pod{}, ReasonNode, fmt.Errorf("pod %s is bound to node %q, not to this node %q", pod.Pod, pod.Node, a.node)
	}
	return pod, "", nil
}
