package buscallout

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func startWithLimits(t *testing.T, lim policy.PodLimits) *fixture {
	t.Helper()
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	return startLimited(t, iss, &authn.JWTVerifier{Keys: authn.StaticKeySet(iss.JWKS()), Issuer: "meshagent-dev", Audience: "istio-ca", TrustDomain: "cluster.local"}, lim)
}

// One token, more connections than a pod may hold: the extra one is refused with
// a named reason and the admitted ones keep working.
func TestPodConnectionsBounded(t *testing.T) {
	f := startWithLimits(t, policy.PodLimits{MaxAdmissions: 3})
	now := time.Now()
	tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod("web-1"))
	var conns []*nats.Conn
	for i := range 3 {
		nc, err := f.connect("web-1", tok)
		if err != nil {
			t.Fatalf("connection %d refused: %v", i+1, err)
		}
		defer nc.Close()
		conns = append(conns, nc)
	}
	if nc, err := f.connect("web-1", tok); err == nil {
		nc.Close()
		t.Fatal("fourth connection on one pod's token admitted")
	}
	if got := testutil.ToFloat64(f.r.refused.WithLabelValues(ReasonTooManyConnections)); got != 1 {
		t.Fatalf("refused{%s} = %v, want 1", ReasonTooManyConnections, got)
	}
	if got := testutil.ToFloat64(f.r.admitted); got != 3 {
		t.Fatalf("admitted = %v, want 3", got)
	}
	for i, nc := range conns {
		if err := nc.FlushTimeout(2 * time.Second); err != nil || !nc.IsConnected() {
			t.Fatalf("admitted connection %d lost: %v", i+1, err)
		}
	}
	// Another pod is counted apart.
	other := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod("web-2"))
	nc, err := f.connect("web-2", other)
	if err != nil {
		t.Fatalf("another pod refused: %v", err)
	}
	nc.Close()
}

// A pod that spent its admissions (its clients gave up on connections the callout
// had admitted: an earlier storm) locks out neither itself once it is recreated
// under its old name (a new pod UID), nor, as before, any other pod. The same
// instance stays bounded: the positive control.
func TestRecreatedPodNotLockedOutByItsPredecessor(t *testing.T) {
	f := startWithLimits(t, policy.PodLimits{MaxAdmissions: 2})
	now := time.Now()
	instance := func(uid string) string {
		c := f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod("web-1")
		c.PodUID = uid
		return f.iss.Mint(t, c)
	}
	first := instance("uid-1")
	for i := range 2 {
		nc, err := f.connect("web-1", first)
		if err != nil {
			t.Fatalf("first instance, connection %d: %v", i+1, err)
		}
		nc.Close() // gone: the storm's client gave up
	}
	if nc, err := f.connect("web-1", first); err == nil {
		nc.Close()
		t.Fatal("the first instance was admitted past its bound")
	}
	nc, err := f.connect("web-1", instance("uid-2"))
	if err != nil {
		t.Fatalf("the pod recreated under its name was locked out by its predecessor: %v", err)
	}
	nc.Close()
}

// A token valid for ten years gives a bus user that expires within the lifetime
// cap; the client is then admitted again with its (still valid) token, and works.
func TestPodUserLifetimeCappedThenReadmitted(t *testing.T) {
	f := startWithLimits(t, policy.PodLimits{Lifetime: 2 * time.Second, Jitter: 0.01})
	now := time.Now()
	tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), 10*365*24*time.Hour).ForPod("web-1"))
	var disconnects, reconnects atomic.Int32
	start := time.Now()
	nc, err := f.connect("web-1", tok,
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disconnects.Add(1) }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnects.Add(1) }),
		nats.ReconnectWait(50*time.Millisecond), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testkit.EventuallyWithin(t, 10*time.Second, "the capped user expires and the pod is admitted again", func() bool {
		return disconnects.Load() >= 1 && reconnects.Load() >= 1 && nc.IsConnected()
	})
	// Expired within the cap (a JWT's expiry is in whole seconds: up to 1 s sooner).
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("user lived %s, cap 2s", took)
	}
	if got := testutil.ToFloat64(f.r.admitted); got < 2 {
		t.Fatalf("admitted = %v, want at least 2 (the re-admission)", got)
	}
	// Its permissions are back: what it publishes on its own subject arrives.
	audit, err := nats.Connect(f.srv.Server.ClientURL(), f.srv.RoleOptions(t, policy.Audit)...)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	own, _ := events.PodEventSubject(events.PodRef{Namespace: "default", Name: "web-1"}, events.PodEventUp)
	sub, err := audit.SubscribeSync(own)
	if err != nil {
		t.Fatal(err)
	}
	if err := audit.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(own, []byte("after re-admission")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "after re-admission" {
		t.Fatalf("publish after re-admission: %v", err)
	}
}

func TestAdmissionsWindow(t *testing.T) {
	a := newAdmissions()
	t0 := time.Unix(1_000_000, 0)
	for i := range 3 {
		if !a.take("p", t0.Add(time.Duration(i)*time.Second), time.Minute, 3) {
			t.Fatalf("admission %d refused", i+1)
		}
	}
	if a.take("p", t0.Add(10*time.Second), time.Minute, 3) {
		t.Fatal("fourth admission within the window taken")
	}
	if !a.take("q", t0.Add(10*time.Second), time.Minute, 3) {
		t.Fatal("another pod refused")
	}
	// The first admission leaves the window: one more is allowed, and only one.
	if !a.take("p", t0.Add(time.Minute+500*time.Millisecond), time.Minute, 3) {
		t.Fatal("admission refused after the oldest left the window")
	}
	if a.take("p", t0.Add(time.Minute+600*time.Millisecond), time.Minute, 3) {
		t.Fatal("admission taken beyond the bound")
	}
	// A pod gone for a window is forgotten.
	a.take("r", t0.Add(5*time.Minute), time.Minute, 3)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.pods["q"]; ok || len(a.pods) != 1 {
		t.Fatalf("stale pods kept: %v", a.pods)
	}
}
