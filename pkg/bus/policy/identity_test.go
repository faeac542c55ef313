package policy_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestOnlyTheAdmittedPodPublishesOnItsIdentitySubject: a signer run with -bus-sign-id
// believes the identity a sign.id subject names, so nats-server must let nothing but
// the pod the callout admitted as that identity publish there — not another pod, not
// the same pod on another identity, and no role that holds an nkey. The same holds
// for each identity subject's replica form (events.ReplicaSignSubject), which a
// signer reads the identity from just the same.
func TestOnlyTheAdmittedPodPublishesOnItsIdentitySubject(t *testing.T) {
	s := bustest.SecureServer(t)
	// The callout: token "id:<ns>/<sa>/<pod>" is admitted as that identity.
	issuer, err := policy.ReadSeed(s.Creds.IssuerFile(), nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	callout := s.Conn(t, policy.Callout, nil)
	if _, err := callout.Subscribe(policy.AuthCalloutSubject, func(m *nats.Msg) {
		req, err := policy.DecodeAuthRequest(m.Data)
		if err != nil {
			t.Errorf("callout: %v", err)
			return
		}
		parts := strings.Split(strings.TrimPrefix(req.ConnectOptions.Token, "id:"), "/")
		resp, err := policy.AdmitPodIdentity(issuer, req, events.PodRef{Namespace: parts[0], Name: parts[2]}, parts[1], time.Now().Add(time.Hour))
		if err != nil {
			resp, err = policy.Refuse(issuer, req, err.Error())
		}
		if err == nil {
			_ = m.Respond(resp)
		}
	}); err != nil {
		t.Fatal(err)
	}
	flushed(t, callout)

	// The signer counts what arrives on each identity subject.
	signer := s.Conn(t, policy.Signer, nil)
	got := map[string]*atomic.Int64{}
	own, _ := events.IdentitySignSubject(ref("shop/web-0"), "web")
	otherSA, _ := events.IdentitySignSubject(ref("shop/web-0"), "admin")
	otherPod, _ := events.IdentitySignSubject(ref("bank/vault-0"), "vault")
	// The same pod name and service account in another namespace.
	otherNS, _ := events.IdentitySignSubject(ref("attacker/web-0"), "web")
	replica := func(subj string) string {
		r, err := events.ReplicaSignSubject("signer-1", subj)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ownReplica := replica(own)
	for _, subj := range []string{own, otherSA, otherPod, otherNS} {
		got[subj], got[replica(subj)] = &atomic.Int64{}, &atomic.Int64{}
	}
	count := func(m *nats.Msg) {
		if c := got[m.Subject]; c != nil {
			c.Add(1)
		}
		_ = m.Respond([]byte("ok"))
	}
	if _, err := signer.QueueSubscribe(events.SignIDWildcard, events.SignerQueue, count); err != nil {
		t.Fatal(err)
	}
	if _, err := signer.Subscribe(events.ReplicaSignWildcard("signer-1"), count); err != nil {
		t.Fatal(err)
	}
	flushed(t, signer)

	var podErrs bustest.Errors
	pod, err := s.PodConn(t, ref("shop/web-0"), "id:shop/web/web-0", &podErrs)
	if err != nil {
		t.Fatalf("pod admitted: %v", err)
	}
	if _, err := pod.Request(own, []byte("csr"), 5*time.Second); err != nil {
		t.Fatalf("pod on its own identity subject: %v", err)
	}
	if _, err := pod.Request(ownReplica, []byte("csr"), 5*time.Second); err != nil {
		t.Fatalf("pod on its own identity subject's replica form: %v", err)
	}
	if got[own].Load() != 1 || got[ownReplica].Load() != 1 {
		t.Fatalf("own subject: %d and %d requests arrived, want 1 each", got[own].Load(), got[ownReplica].Load())
	}

	// Everyone else publishing on an identity subject: nothing arrives, the server
	// reports a permission violation.
	publish := func(name string, nc *nats.Conn, errs *bustest.Errors, subj string) {
		t.Helper()
		if err := nc.Publish(subj, []byte("csr")); err != nil {
			t.Fatal(err)
		}
		flushed(t, nc)
		violation(t, name, errs, subj)
	}
	for _, subj := range []string{otherSA, replica(otherSA)} {
		publish("pod on another service account", pod, &podErrs, subj)
	}
	for _, subj := range []string{otherPod, replica(otherPod)} {
		publish("pod on another pod's identity", pod, &podErrs, subj)
	}
	for _, subj := range []string{otherNS, replica(otherNS)} {
		publish("pod on its namesake's identity in another namespace", pod, &podErrs, subj)
	}
	for _, r := range policy.Users {
		if r == policy.Callout {
			continue // another account: its publishes never reach the mesh (checked below)
		}
		for _, subj := range []string{own, ownReplica} {
			var errs bustest.Errors
			publish(string(r), s.Conn(t, r, &errs), &errs, subj)
		}
	}
	for _, subj := range []string{own, ownReplica} {
		if err := callout.Publish(subj, []byte("csr")); err != nil {
			t.Fatal(err)
		}
	}
	flushed(t, callout, signer)
	for subj, c := range got {
		if want := map[bool]int64{true: 1, false: 0}[subj == own || subj == ownReplica]; c.Load() != want {
			t.Errorf("%s: %d requests arrived, want %d", subj, c.Load(), want)
		}
	}
}

// violation waits for the server's permission violation for subj on errs.
func violation(t *testing.T, name string, errs *bustest.Errors, subj string) {
	t.Helper()
	testkit.Eventually(t, name+" denied publishing on "+subj, func() bool {
		for _, err := range errs.All() {
			if strings.Contains(err.Error(), "Permissions Violation for Publish to \""+subj+"\"") {
				return true
			}
		}
		return false
	})
}
