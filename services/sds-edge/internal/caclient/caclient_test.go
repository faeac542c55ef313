package caclient

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
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

// signer answers subject (as the signer role, queue "signer") with a refusal naming
// the subject and encoding the request came in, or with the answer of a signer
// that predates identity subjects when old is set; jsonOnly, it reads CloudEvents
// only and answers anything else as a signer from before the compact encoding does.
func signer(t *testing.T, s *bustest.Secured, subject string, old, jsonOnly bool) {
	t.Helper()
	nc := s.Conn(t, policy.Signer, nil)
	if _, err := nc.QueueSubscribe(subject, events.SignerQueue, func(m *nats.Msg) {
		_, enc, err := events.DecodeSignRequest(m)
		if jsonOnly {
			enc = events.EncodingJSON
			_, _, err = events.Decode[events.SignRequest](m)
		}
		msg := "answered on " + m.Subject + " (" + enc.String() + ")"
		if _, _, id := events.IdentityFromSignSubject(m.Subject); id && old {
			msg = "unknown sign subject " + m.Subject
		}
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
}

// shopWeb0 is the test pod, shop/web-0.
var shopWeb0 = events.PodRef{Namespace: "shop", Name: "web-0"}

// pemCSR passes the request's schema; the stand-in signers never parse it.
const pemCSR = "-----BEGIN CERTIFICATE REQUEST-----\nMA==\n-----END CERTIFICATE REQUEST-----\n"

// TestSignsOnIdentitySubjectThenFallsBack: a pod admitted as shop/web asks on its
// identity subject when a signer answers there, and on its pod subject (token in
// the body) when none does or an older signer does not know the subject; it asks
// in the compact encoding, and again as a CloudEvent of a signer that reads only
// those.
func TestSignsOnIdentitySubjectThenFallsBack(t *testing.T) {
	idSubject, _ := events.IdentitySignSubject(shopWeb0, "web")
	podSubject, _ := events.PodSignSubject(shopWeb0)
	for _, tc := range []struct {
		name           string
		subscribe      []string
		old, jsonOnly  bool
		want, encoding string
	}{
		{"signer with -bus-sign-id", []string{events.SignWildcard}, false, false, idSubject, "compact"},
		{"signer without it", []string{events.SignPodWildcard, events.SubjectSignAny}, false, false, podSubject, "compact"},
		{"signer from before identity subjects", []string{events.SignWildcard}, true, true, podSubject, "json"},
		{"signer from before the compact encoding", []string{events.SignWildcard}, false, true, idSubject, "json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pod := securedPod(t)
			for _, subj := range tc.subscribe {
				signer(t, s, subj, tc.old, tc.jsonOnly)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := NewNATSAs(pod, "sds-edge/shop/web-0", "web").Sign(ctx, events.SignRequest{CSR: pemCSR, Token: "token", Pod: shopWeb0})
			if want := "answered on " + tc.want + " (" + tc.encoding + ")"; !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), want) {
				t.Fatalf("got %v, want %q", err, want)
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
