package devstack

import (
	"slices"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

func podEvent(t *testing.T, pod, kind string, p events.Payload) *nats.Msg {
	t.Helper()
	subj, err := events.PodEventSubject(events.PodRef{Namespace: "default", Name: pod}, kind)
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Encode(subj, events.Meta{Source: "test", Subject: pod, Time: time.Now()}, p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The waiter counts a pod's certificate from cert.issued or sds.pushed of default,
// its Envoy from envoy.ready on its own subject, and nothing else.
func TestPodWaiterCountsOnlyWhatShowsAPodIsUp(t *testing.T) {
	w := newPodWaiter(time.Now())
	pods := []*podStart{{id: "demo-0"}, {id: "demo-1"}}
	now := time.Now()
	issued, err := events.Encode(events.SubjectCertIssued, events.Meta{Source: "test", Subject: "01", Time: now}, events.CertIssued{
		Serial: "01", SPIFFEID: "spiffe://cluster.local/ns/default/sa/demo", NotBefore: now, NotAfter: now.Add(time.Hour),
		Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0", RootFingerprint: "ab"})
	if err != nil {
		t.Fatal(err)
	}
	w.observe(issued)
	// ROOTCA is not the pod's certificate; a payload naming another pod than its
	// subject is ignored.
	w.observe(podEvent(t, "demo-1", events.PodEventSecretPushed, events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "demo-1"}, Resource: "ROOTCA", Version: "1", Kind: "served"}))
	w.observe(podEvent(t, "demo-1", events.PodEventSecretPushed, events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, Resource: "default", Version: "1", Kind: "served"}))
	w.observe(podEvent(t, "demo-1", events.PodEventEnvoyReady, events.EnvoyReady{Pod: events.PodRef{Namespace: "default", Name: "demo-1"}, PID: 1}))
	want := []string{"demo-0: envoy.ready", "demo-1: certificate"}
	if got := w.missing(pods); !slices.Equal(got, want) {
		t.Fatalf("missing %q, want %q", got, want)
	}
	w.observe(podEvent(t, "demo-1", events.PodEventSecretPushed, events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "demo-1"}, Resource: "default", Version: "1", Kind: "served"}))
	w.observe(podEvent(t, "demo-0", events.PodEventEnvoyReady, events.EnvoyReady{Pod: events.PodRef{Namespace: "default", Name: "demo-0"}, PID: 2}))
	if got := w.missing(pods); len(got) != 0 {
		t.Fatalf("missing %q after every pod showed both", got)
	}
}
