package signer

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/natsapi"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
)

// TestAReplicaAnswersByName: every live replica answers the ping with its name
// (SubjectSignerPing, no queue group), and a request on the replica form of a pod's
// identity subject is signed by that replica alone, the identity read from the
// subject as on the identity subject itself.
func TestAReplicaAnswersByName(t *testing.T) {
	e := newSecureEnv(t)
	a := e.start(t, e.config("signer-a", true))
	b := e.start(t, e.config("signer-b", true))
	pod := e.pod(t, "shop", "web", "web-0", nil)

	// Both answer the ping (a request on a fresh inbox collects every pong).
	inbox := pod.NewRespInbox()
	pongs, err := pod.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	ping, err := events.NewMsg(events.SubjectSignerPing, "test", events.SignerPing{})
	if err != nil {
		t.Fatal(err)
	}
	ping.Reply = inbox
	if err := pod.PublishMsg(ping); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for len(names) < 2 {
		m, err := pongs.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("pongs %v: %v", names, err)
		}
		pong, _, err := events.Decode[events.SignerPong](m)
		if err != nil {
			t.Fatal(err)
		}
		names[pong.Replica] = true
	}
	if !names["signer-a"] || !names["signer-b"] {
		t.Fatalf("pongs %v, want signer-a and signer-b", names)
	}

	own, _ := events.IdentitySignSubject(shopPod("web-0"), "web")
	direct, err := events.ReplicaSignSubject("signer-b", own)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // each with a new key: a repeated CSR is answered with its certificate
		_, csr := signertest.CSR(t, pki.ECP256, askedID)
		msg, err := events.NewMsgOn(direct, "test", events.SignRequest{CSR: string(csr), Token: "not-even-a-jwt", Pod: shopPod("web-0")})
		if err != nil {
			t.Fatal(err)
		}
		rep := natsRaw(t, pod, msg)
		if rep.Error != nil {
			t.Fatalf("sign on %s: %v", direct, rep.Error)
		}
		if got := mustCerts(t, rep.CertChain)[0].URIs[0].String(); got != "spiffe://cluster.local/ns/shop/sa/web" {
			t.Fatalf("issued for %s, want the subject's identity", got)
		}
	}
	if got, other := metricValue(t, b.metrics(t), certsIssued), metricValue(t, a.metrics(t), certsIssued); got != 3 || other != 0 {
		t.Fatalf("signer-b issued %v and signer-a %v, want 3 and 0", got, other)
	}
}

// TestReplicaNameIsOneToken: an instance id that cannot be a subject token (a
// host name with dots) still gives a replica a name it can be reached by.
func TestReplicaNameIsOneToken(t *testing.T) {
	for _, instance := range []string{"signer-1", "signer-7d9f8b-x2k4", "ip-10-0-0-1.ec2.internal", "-x-"} {
		name := natsapi.ReplicaName(instance)
		if err := events.ValidateIdentityToken(name); err != nil {
			t.Errorf("%q -> %q: %v", instance, name, err)
		}
		if events.ValidateIdentityToken(instance) == nil && name != instance {
			t.Errorf("%q renamed to %q", instance, name)
		}
	}
	if natsapi.ReplicaName("a.b") == natsapi.ReplicaName("a.c") {
		t.Error("two instances share a replica name")
	}
}
