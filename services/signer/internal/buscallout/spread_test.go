package buscallout

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// 200 pods whose tokens were minted together (a deploy) and expire together: the
// server ends their bus users at points spread over the tokens' last 15%, not in
// one second, and none outlives its token. Each pod's disconnect time is what the
// server did, seen by the client.
func TestUsersMintedTogetherDoNotExpireTogether(t *testing.T) {
	f := startTuned(t, Capacity{}, &countingVerifier{})
	const pods = 200
	// 30 s left, room to admit 200 pods one after another on a loaded machine (with
	// 10 s left, admission still ran under -race at load 10-20 when the first users'
	// points had passed); the spread is the last 15 %, 6 s.
	minted := time.Now().Add(-10 * time.Second)
	exp := minted.Add(40 * time.Second)
	var mu sync.Mutex
	var ends []time.Time
	var wrong []error
	for i := range pods {
		name := fmt.Sprintf("web-%d", i)
		tok := f.iss.Mint(t, f.iss.ServiceAccount("default", "web", minted, exp.Sub(minted)).ForPod(name))
		nc, err := f.connect(name, tok, nats.NoReconnect(), nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			mu.Lock()
			defer mu.Unlock()
			ends = append(ends, time.Now())
			if err != nil && err != nats.ErrAuthExpired {
				wrong = append(wrong, err)
			}
		}), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		defer nc.Close()
	}
	testkit.Poll(time.Until(exp)+3*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ends) == pods
	})
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != pods {
		t.Fatalf("%d of %d pods' users ended by their tokens' expiry (+2 s)", len(ends), pods)
	}
	if len(wrong) > 0 {
		t.Fatalf("users ended for another reason than their expiry: %v", wrong[0])
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	perSecond := map[int64]int{}
	most := 0
	for _, e := range ends {
		perSecond[e.Unix()]++
		most = max(most, perSecond[e.Unix()])
	}
	t.Logf("first %s before the tokens' expiry, last %s; per second %v", exp.Sub(ends[0]).Round(time.Millisecond), exp.Sub(ends[len(ends)-1]).Round(time.Millisecond), perSecond)
	if most > pods*6/10 {
		t.Fatalf("%d of %d users ended in the same second", most, pods)
	}
	if spread := ends[len(ends)-1].Sub(ends[0]); spread < 1500*time.Millisecond {
		t.Fatalf("users ended within %s of each other", spread)
	}
	if last := ends[len(ends)-1]; last.After(exp.Add(1500 * time.Millisecond)) {
		t.Fatalf("a user outlived its token by %s", last.Sub(exp))
	}
}

// A pod's point is its own and the same at every admission with one credential;
// admitted again past it, the user lives until the credential's expiry (not
// jittered over and over toward it); the lifetime cap still comes first when
// sooner.
func TestUserExpiryPointPerPod(t *testing.T) {
	r := &Responder{limits: policy.PodLimits{Lifetime: time.Hour, Jitter: 0.1}.WithDefaults(), jitter: func() float64 { return 0.5 }}
	now := time.Now()
	caller := authn.Caller{Pod: events.PodRef{Namespace: "default", Name: "web-1"}, Issued: now.Add(-30 * time.Minute), Expires: now.Add(10 * time.Minute)}
	p1 := r.userExpiry(now, caller)
	if p1 != r.userExpiry(now.Add(time.Second), caller) {
		t.Fatal("one pod, one credential: two points")
	}
	if earliest := caller.Expires.Add(-time.Duration(TokenSpread * float64(40*time.Minute))); p1.Before(earliest) || !p1.Before(caller.Expires) {
		t.Fatalf("point %s outside the credential's last %g", caller.Expires.Sub(p1), TokenSpread)
	}
	if got := r.userExpiry(p1.Add(time.Second), caller); !got.Equal(caller.Expires) {
		t.Fatalf("admitted past its point: expires %s before the credential, want at it", caller.Expires.Sub(got))
	}
	other := caller
	other.Pod.Name = "web-2"
	if r.userExpiry(now, other) == p1 {
		t.Fatal("two pods with one expiry share a point")
	}
	long := caller
	long.Expires = now.Add(48 * time.Hour)
	if got, want := r.userExpiry(now, long), now.Add(time.Hour-time.Duration(0.5*0.1*float64(time.Hour))); !got.Equal(want) {
		t.Fatalf("capped user expires at %s, want %s", got, want)
	}
}
