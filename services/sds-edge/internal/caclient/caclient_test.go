package caclient

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// securedPod is a pod connection to a bus secured with the real role table, admitted
// by a callout that grants what the signer's does (policy.AdmitPodIdentity) for
// shop/web/web-0.
func securedPod(t *testing.T) (*bustest.Secured, *nats.Conn) {
	t.Helper()
	s := bustest.SecureServer(t)
	issuer, err := policy.ReadSeed(s.Creds.IssuerFile(), nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	callout := s.Conn(t, policy.Callout, nil)
	if _, err := callout.Subscribe(policy.AuthCalloutSubject, func(m *nats.Msg) {
		req, err := policy.DecodeAuthRequest(m.Data)
		if err != nil {
			return
		}
		resp, err := policy.AdmitPodIdentity(issuer, req, shopWeb0, "web", time.Now().Add(time.Hour))
		if err == nil {
			_ = m.Respond(resp)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := callout.Flush(); err != nil {
		t.Fatal(err)
	}
	pod, err := s.PodConn(t, shopWeb0, "token", nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, pod
}

// signer answers every sign subject (as the signer role, queue "signer") with a
// refusal naming the subject and encoding each request came in, and counts them.
// The refusal reads as old signers' "unknown sign subject" did: a client that
// decided by the text would ask again elsewhere.
func signer(t *testing.T, s *bustest.Secured) *atomic.Int32 {
	t.Helper()
	var asked atomic.Int32
	nc := s.Conn(t, policy.Signer, nil)
	if _, err := nc.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) {
		asked.Add(1)
		_, enc, err := events.DecodeSignRequest(m)
		msg := "unknown sign subject " + m.Subject + " (" + enc.String() + ")"
		if err != nil {
			msg = err.Error()
		}
		reply, err := events.NewSignReplyMsg(m.Reply, enc, "signer", events.SignReply{Error: &events.ReplyError{Code: events.CodeInvalidArgument, Message: msg}})
		if err == nil {
			_ = nc.PublishMsg(reply)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &asked
}

// shopWeb0 is the test pod, shop/web-0.
var shopWeb0 = events.PodRef{Namespace: "shop", Name: "web-0"}

// pemCSR passes the request's schema; the stand-in signers never parse it.
const pemCSR = "-----BEGIN CERTIFICATE REQUEST-----\nMA==\n-----END CERTIFICATE REQUEST-----\n"

// TestSignsOnceOnItsSubjectInTheCompactEncoding: one request, one round trip. A pod
// admitted by its credential as shop/web asks on its identity subject, one without
// on its pod subject, always in the compact encoding; a refusal is final for the
// attempt (no second subject or encoding is tried), and with no signer at all the
// CA is unreachable.
func TestSignsOnceOnItsSubjectInTheCompactEncoding(t *testing.T) {
	idSubject, _ := events.IdentitySignSubject(shopWeb0, "web")
	podSubject, _ := events.PodSignSubject(shopWeb0)
	for _, tc := range []struct {
		name, sa, want string
	}{
		{"admitted by its credential", "web", idSubject},
		{"no service account known", "", podSubject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pod := securedPod(t)
			asked := signer(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := NewNATS(pod, "sds-edge/shop/web-0")
			if tc.sa != "" {
				c = NewNATSAs(pod, "sds-edge/shop/web-0", tc.sa)
			}
			_, err := c.Sign(ctx, events.SignRequest{CSR: pemCSR, Token: "token", Pod: shopWeb0})
			if want := "unknown sign subject " + tc.want + " (compact)"; !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), want) {
				t.Fatalf("got %v, want %q", err, want)
			}
			if n := asked.Load(); n != 1 {
				t.Fatalf("%d requests for one signing: want exactly one round trip", n)
			}
		})
	}
	t.Run("no signer at all", func(t *testing.T) {
		_, pod := securedPod(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := NewNATSAs(pod, "sds-edge/shop/web-0", "web").Sign(ctx, events.SignRequest{CSR: pemCSR, Token: "token", Pod: shopWeb0})
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("got %v, want unreachable", err)
		}
	})
}

// TestATimedOutRequestGoesToALiveReplica: the signer queue group's only member
// here holds requests and never answers (a frozen replica on the pod's node, which
// nats-server prefers); a live replica answers only by name. The pod's request
// waits half its time in the queue group, carrying that half as its deadline (so
// that the frozen replica drops it on resuming), then pings, and is answered by the
// live replica on the replica form of the pod's own identity subject — which the
// pod's real bus permissions allow.
func TestATimedOutRequestGoesToALiveReplica(t *testing.T) {
	s, pod := securedPod(t)
	idSubject, _ := events.IdentitySignSubject(shopWeb0, "web")
	frozen := s.Conn(t, policy.Signer, nil)
	held := make(chan events.SignRequest, 4)
	if _, err := frozen.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) {
		req, _, err := events.DecodeSignRequest(m)
		if err == nil {
			held <- req
		}
	}); err != nil {
		t.Fatal(err)
	}
	live := s.Conn(t, policy.Signer, nil)
	var byName atomic.Int32
	if _, err := live.Subscribe(events.SubjectSignerPing, func(m *nats.Msg) {
		reply, err := events.NewMsg(m.Reply, "signer-2", events.SignerPong{Replica: "signer-2"})
		if err == nil {
			_ = live.PublishMsg(reply)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Subscribe(events.ReplicaSignWildcard("signer-2"), func(m *nats.Msg) {
		byName.Add(1)
		reply, err := events.NewSignReplyMsg(m.Reply, events.EncodingCompact, "signer-2",
			events.SignReply{Error: &events.ReplyError{Code: events.CodeInvalidArgument, Message: "answered on " + m.Subject}})
		if err == nil {
			_ = live.PublishMsg(reply)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(frozen.Flush(), live.Flush()); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	start := time.Now()
	_, err := NewNATSAs(pod, "sds-edge/shop/web-0", "web").Sign(ctx, events.SignRequest{CSR: pemCSR, Token: "token", Pod: shopWeb0})
	direct, _ := events.ReplicaSignSubject("signer-2", idSubject)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "answered on "+direct) {
		t.Fatalf("got %v, want the live replica's answer on %s", err, direct)
	}
	if n := byName.Load(); n != 1 {
		t.Fatalf("the live replica was asked %d times, want 1", n)
	}
	select {
	case req := <-held:
		// Its own deadline, about half of the attempt's: the frozen replica drops it.
		if !req.Deadline.Before(deadline.Add(-time.Second)) || req.Deadline.Before(start) {
			t.Fatalf("the request held by the frozen replica carries deadline %s; the attempt's is %s", req.Deadline, deadline)
		}
	default:
		t.Fatal("the frozen replica held nothing: the test proves nothing")
	}
	if len(held) != 0 {
		t.Fatalf("%d more requests went to the frozen replica", len(held))
	}
}
