package buscallout

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fixture struct {
	srv *bustest.Secured
	iss *tokentest.Issuer
	r   *Responder
}

// start runs the responder against a server secured with the real role table,
// verifying tokens of iss for trust domain cluster.local.
func start(t *testing.T) *fixture {
	t.Helper()
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	return startWith(t, iss, &authn.JWTVerifier{Keys: authn.StaticKeySet(iss.JWKS()), Issuer: "meshagent-dev", Audience: "istio-ca", TrustDomain: "cluster.local"})
}

// startWith runs the responder with verifier v.
func startWith(t *testing.T, iss *tokentest.Issuer, v Verifier) *fixture {
	t.Helper()
	return startLimited(t, iss, v, policy.PodLimits{})
}

// startLimited runs the responder with verifier v and limits lim (zero fields:
// the defaults).
func startLimited(t *testing.T, iss *tokentest.Issuer, v Verifier, lim policy.PodLimits) *fixture {
	t.Helper()
	srv := bustest.SecureServer(t)
	issuer, err := policy.ReadSeed(srv.Creds.IssuerFile(), nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context) (*nats.Conn, error) {
		return nats.Connect(srv.Server.ClientURL(), srv.RoleOptions(t, policy.Callout)...)
	}
	r := New(issuer, v, nil, dial, prometheus.NewRegistry(), hclog.NewNullLogger(), clock.Real{}).Limit(lim)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testkit.EventuallyWithin(t, 10*time.Second, "callout ready", func() bool { return r.Ready() == nil })
	return &fixture{srv: srv, iss: iss, r: r}
}

// connect connects with token and the inbox of pod ("<namespace>/<name>", a bare
// name in the default namespace).
func (f *fixture) connect(pod, token string, opts ...nats.Option) (*nats.Conn, error) {
	ref, err := events.ParsePodRef(pod)
	if err != nil {
		return nil, err
	}
	return nats.Connect(f.srv.Server.ClientURL(), append([]nats.Option{nats.Token(token),
		nats.CustomInboxPrefix(policy.Inbox(policy.Pod, ref)), nats.Timeout(5 * time.Second)}, opts...)...)
}

func TestPodTokenAdmitsThatPodOnly(t *testing.T) {
	f := start(t)
	now := time.Now()
	tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod("web-1"))
	nc, err := f.connect("web-1", tok, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("pod-bound token refused: %v", err)
	}
	defer nc.Close()
	// Admitted as web-1: its own subjects work, another pod's do not.
	sc, err := nats.Connect(f.srv.Server.ClientURL(), f.srv.RoleOptions(t, policy.Signer)...)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) { _ = m.Respond([]byte(m.Subject)) }); err != nil {
		t.Fatal(err)
	}
	if err := sc.Flush(); err != nil {
		t.Fatal(err)
	}
	own, _ := events.PodSignSubject(events.PodRef{Namespace: "default", Name: "web-1"})
	if resp, err := nc.Request(own, nil, 5*time.Second); err != nil || string(resp.Data) != own {
		t.Fatalf("own sign subject: %v", err)
	}
	other, _ := events.PodSignSubject(events.PodRef{Namespace: "default", Name: "web-2"})
	if _, err := nc.Request(other, nil, 300*time.Millisecond); err == nil {
		t.Fatal("pod web-1 had a request on web-2's sign subject answered")
	}
	if got := testutil.ToFloat64(f.r.admitted); got != 1 {
		t.Fatalf("admitted = %v", got)
	}
}

func TestRefusedAtConnect(t *testing.T) {
	f := start(t)
	now := time.Now()
	stranger := tokentest.NewIssuer(t, "other-domain-issuer")
	good := f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour).ForPod("web-1")
	expired := f.iss.ServiceAccount("default", "web", now.Add(-3*time.Hour), time.Hour).ForPod("web-1")
	tests := []struct {
		name, token, reason string
	}{
		{"another trust domain's issuer", stranger.Mint(t, good), ReasonBadToken},
		{"issuer name right, key wrong", tokentest.MintWith(t, stranger.Key, f.iss.KID, good), ReasonBadToken},
		{"expired token", f.iss.Mint(t, expired), ReasonBadToken},
		{"token without a pod claim", f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now.Add(-time.Minute), time.Hour)), ReasonNotPodBound},
		{"garbage", "not-a-jwt", ReasonBadToken},
		{"no credential at all", "", ReasonNoToken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(f.r.refused.WithLabelValues(tc.reason))
			var nc *nats.Conn
			var err error
			if tc.token == "" {
				nc, err = nats.Connect(f.srv.Server.ClientURL(), nats.Timeout(5*time.Second))
			} else {
				nc, err = f.connect("web-1", tc.token)
			}
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Fatalf("want an authorization error, got %v", err)
			}
			if got := testutil.ToFloat64(f.r.refused.WithLabelValues(tc.reason)); got != before+1 {
				t.Fatalf("refused{reason=%s} = %v, want %v", tc.reason, got, before+1)
			}
		})
	}
	if got := testutil.ToFloat64(f.r.admitted); got != 0 {
		t.Fatalf("admitted = %v", got)
	}
}

// TestPodUserExpiresWithToken: the bus user lives no longer than the token; the
// server disconnects the pod when it expires.
func TestPodUserExpiresWithToken(t *testing.T) {
	f := start(t)
	now := time.Now()
	tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", now, 3*time.Second).ForPod("web-1"))
	expired := make(chan error, 1)
	nc, err := f.connect("web-1", tok, nats.NoReconnect(), nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
		select {
		case expired <- err:
		default:
		}
	}), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case expired <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	select {
	case err := <-expired:
		if !errors.Is(err, nats.ErrAuthExpired) {
			t.Fatalf("disconnected with %v, want authentication expired", err)
		}
		if time.Since(now) > 6*time.Second {
			t.Fatalf("user outlived its token by %s", time.Since(now)-3*time.Second)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pod still connected 10s after its token expired")
	}
}

// TestRefusedAsNotReadyUntilKeysLoad: while the signer has not loaded the token
// keys yet, a pod is refused as not_ready (its client retries), not as a bad token;
// once they are loaded the same token is admitted.
func TestRefusedAsNotReadyUntilKeysLoad(t *testing.T) {
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	dir := t.TempDir()
	keys := &authn.KeySet{File: filepath.Join(dir, "jwks.json")}
	f := startWith(t, iss, &authn.JWTVerifier{Keys: keys, Issuer: "meshagent-dev", Audience: "istio-ca", TrustDomain: "cluster.local"})
	tok := iss.Mint(t, iss.ServiceAccount("default", "web", time.Now().Add(-time.Minute), time.Hour).ForPod("web-1"))
	if nc, err := f.connect("web-1", tok); err == nil {
		nc.Close()
		t.Fatal("admitted before the keys were loaded")
	}
	if got := testutil.ToFloat64(f.r.refused.WithLabelValues(ReasonNotReady)); got != 1 {
		t.Fatalf("refused{not_ready} = %v", got)
	}
	if got := testutil.ToFloat64(f.r.refused.WithLabelValues(ReasonBadToken)); got != 0 {
		t.Fatalf("refused{bad_token} = %v: a good token counted as bad", got)
	}
	iss.WriteJWKS(t, dir)
	if err := keys.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc, err := f.connect("web-1", tok)
	if err != nil {
		t.Fatalf("refused once the keys are loaded: %v", err)
	}
	nc.Close()
}

// TestRefusedAsUnavailableWhenTokenReviewIsDown: an API server that does not answer
// is no verdict on the token: refused as unavailable, the pod's client retries.
func TestRefusedAsUnavailableWhenTokenReviewIsDown(t *testing.T) {
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	f := startWith(t, iss, &authn.TokenReviewer{URL: "https://127.0.0.1:1", Audience: "istio-ca", TrustDomain: "cluster.local"})
	tok := iss.Mint(t, iss.ServiceAccount("default", "web", time.Now().Add(-time.Minute), time.Hour).ForPod("web-1"))
	if nc, err := f.connect("web-1", tok); err == nil {
		nc.Close()
		t.Fatal("admitted without a verdict")
	}
	if got := testutil.ToFloat64(f.r.refused.WithLabelValues(ReasonUnavailable)); got != 1 {
		t.Fatalf("refused{unavailable} = %v", got)
	}
}

// TestPodAdmittedOnItsIdentitySubject: the callout grants the identity sign subject
// its verified token proves (namespace, service account, pod) and no other; a
// service account that cannot be one subject token is refused, not escaped.
func TestPodAdmittedOnItsIdentitySubject(t *testing.T) {
	f := start(t)
	now := time.Now()
	tok := f.iss.Mint(t, f.iss.ServiceAccount("shop", "web", now.Add(-time.Minute), time.Hour).ForPod("web-1"))
	nc, err := f.connect("shop/web-1", tok, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("pod-bound token refused: %v", err)
	}
	defer nc.Close()
	sc, err := nats.Connect(f.srv.Server.ClientURL(), f.srv.RoleOptions(t, policy.Signer)...)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) { _ = m.Respond([]byte(m.Subject)) }); err != nil {
		t.Fatal(err)
	}
	if err := sc.Flush(); err != nil {
		t.Fatal(err)
	}
	own, _ := events.IdentitySignSubject(events.PodRef{Namespace: "shop", Name: "web-1"}, "web")
	if resp, err := nc.Request(own, nil, 5*time.Second); err != nil || string(resp.Data) != own {
		t.Fatalf("own identity sign subject: %v", err)
	}
	for _, other := range [][3]string{{"shop", "admin", "web-1"}, {"bank", "web", "web-1"}, {"shop", "web", "web-2"}} {
		subj, _ := events.IdentitySignSubject(events.PodRef{Namespace: other[0], Name: other[2]}, other[1])
		if _, err := nc.Request(subj, nil, 300*time.Millisecond); err == nil {
			t.Fatalf("pod shop/web/web-1 had a request on %s answered", subj)
		}
	}

	dotted := f.iss.Mint(t, f.iss.ServiceAccount("shop", "web.v2", now.Add(-time.Minute), time.Hour).ForPod("web-3"))
	if nc, err := f.connect("shop/web-3", dotted); err == nil {
		nc.Close()
		t.Fatal("service account web.v2 admitted: it cannot be one subject token")
	}
	if got := testutil.ToFloat64(f.r.refused.WithLabelValues(ReasonNotSubjectSafe)); got != 1 {
		t.Fatalf("refused as %s = %v, want 1", ReasonNotSubjectSafe, got)
	}
}

// TestSameNameInAnotherNamespaceIsAnotherPod: a token for attacker/web-1 admits pod
// attacker/web-1, whose subjects are none of default/web-1's; claiming to be
// default/web-1 (the connect user name) with it is refused.
func TestSameNameInAnotherNamespaceIsAnotherPod(t *testing.T) {
	f := start(t)
	now := time.Now()
	tok := f.iss.Mint(t, f.iss.ServiceAccount("attacker", "evil", now.Add(-time.Minute), time.Hour).ForPod("web-1"))
	sc, err := nats.Connect(f.srv.Server.ClientURL(), f.srv.RoleOptions(t, policy.Signer)...)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	var victimRequests atomic.Int64
	victim := events.PodRef{Namespace: "default", Name: "web-1"}
	victimSign, _ := events.PodSignSubject(victim)
	victimID, _ := events.IdentitySignSubject(victim, "evil")
	if _, err := sc.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) {
		if m.Subject == victimSign || m.Subject == victimID {
			victimRequests.Add(1)
		}
		_ = m.Respond([]byte(m.Subject))
	}); err != nil {
		t.Fatal(err)
	}
	if err := sc.Flush(); err != nil {
		t.Fatal(err)
	}

	// Claiming the victim's name: refused at connect.
	if nc, err := f.connect("attacker/web-1", tok, nats.UserInfo("default/web-1", "")); err == nil {
		nc.Close()
		t.Fatal("a token for attacker/web-1 admitted as default/web-1")
	}
	if got := testutil.ToFloat64(f.r.refused.WithLabelValues(ReasonPodMismatch)); got != 1 {
		t.Fatalf("refused as %s = %v, want 1", ReasonPodMismatch, got)
	}

	nc, err := f.connect("attacker/web-1", tok, nats.UserInfo("attacker/web-1", ""), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("attacker/web-1 refused with its own token and claim: %v", err)
	}
	defer nc.Close()
	own, _ := events.PodSignSubject(events.PodRef{Namespace: "attacker", Name: "web-1"})
	if resp, err := nc.Request(own, nil, 5*time.Second); err != nil || string(resp.Data) != own {
		t.Fatalf("own sign subject: %v", err)
	}
	for _, subj := range []string{victimSign, victimID} {
		if _, err := nc.Request(subj, nil, 300*time.Millisecond); err == nil {
			t.Fatalf("attacker/web-1 had a request on %s answered", subj)
		}
	}
	if err := sc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := victimRequests.Load(); n != 0 {
		t.Fatalf("the signer received %d requests on default/web-1's subjects", n)
	}
}
