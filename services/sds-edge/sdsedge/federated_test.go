package sdsedge_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestPodStartedAfterAnnouncementHoldsForeignRoots (issue 28): a pod started
// after its signer announced a foreign domain's bundle serves that domain in
// ROOTCA_SPIFFE within a second of starting, read from the CA's history and
// checked as a live announcement: one endorsed by another key is refused, and a
// domain without an announcement in the stream is left out.
func TestPodStartedAfterAnnouncementHoldsForeignRoots(t *testing.T) {
	v := newEnv(t)
	west := testkit.NewCA(t, "west", nil, time.Now(), time.Hour)
	mallory := testkit.NewCA(t, "mallory", nil, time.Now(), time.Hour)
	v.ca.mu.Lock()
	home := v.ca.keys[0]
	v.ca.federated = []string{"west.example", "forged.example", "silent.example"}
	v.ca.mu.Unlock()
	announce := func(foreign string, roots *testkit.CA, by crypto.Signer) {
		ev := events.TrustFederated{TrustDomain: v.ca.td, Foreign: foreign, Roots: pki.CertPEMs([]*x509.Certificate{roots.Cert}), Version: 1, Source: "test"}
		var err error
		if ev.Endorsements, err = trustbundle.EndorseFederated(ev.TrustDomain, ev.Foreign, ev.Version, ev.Roots, by); err != nil {
			t.Fatal(err)
		}
		subj, _ := events.TrustFederatedSubject(foreign)
		msg, err := events.NewMsg(subj, "signer/test", ev)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := bus.Publish(ctx, bustest.JetStream(t, v.nc), msg); err != nil {
			t.Fatal(err)
		}
	}
	announce("west.example", west, home)
	announce("forged.example", mallory, mallory.Key)

	start := time.Now()
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "ROOTCA_SPIFFE")
	var got map[string]string
	for {
		u := recv(t, st)
		got = map[string]string{}
		for _, d := range u.Secrets["ROOTCA_SPIFFE"].SPIFFE {
			got[d.Name] = string(d.Bundle)
		}
		if _, ok := got["west.example"]; ok {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no west.example in ROOTCA_SPIFFE 5 s after start: %v", got)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the foreign roots came %s after start, want within a second", d)
	}
	if got["west.example"] != west.PEM() {
		t.Fatalf("west.example roots %q", got["west.example"])
	}
	testkit.Eventually(t, "the forged announcement refused", func() bool {
		return p.metric(t, "meshagent_sds_edge_trust_rejected_total") >= 1
	})
	u := recv(t, p.open(t, p.dial(t), "ROOTCA_SPIFFE"))
	for _, d := range u.Secrets["ROOTCA_SPIFFE"].SPIFFE {
		if d.Name == "forged.example" || d.Name == "silent.example" {
			t.Fatalf("ROOTCA_SPIFFE serves %s", d.Name)
		}
	}
}
