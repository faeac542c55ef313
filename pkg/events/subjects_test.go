package events

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestPodSubjectsRoundTrip(t *testing.T) {
	pod := PodRef{Namespace: "shop", Name: "web-0.shop"}
	sign, _ := PodSignSubject(pod)
	up, _ := PodEventSubject(pod, PodEventSecretPushed)
	renew, _ := PodRenewSubject(pod)
	anchors, _ := PodAnchorsSubject(pod)
	if sign != "meshagent.rpc.sign.pod.shop.web-0~shop" || up != "meshagent.evt.pod.shop.web-0~shop.sds.pushed" ||
		renew != "meshagent.pod.shop.web-0~shop.renew" || anchors != "meshagent.pod.shop.web-0~shop.anchors" {
		t.Fatalf("subjects: %s %s %s %s", sign, up, renew, anchors)
	}
	for _, tc := range []struct {
		name, subject string
		pod           PodRef
		kind          string
		ok            bool
	}{
		{"sign", sign, pod, "", true},
		{"event", up, pod, PodEventSecretPushed, true},
		{"command", renew, pod, "", true},
		{"anchors", anchors, pod, "", true},
		{"sign any", SubjectSignAny, PodRef{}, "", false},
		{"sign with extra token", sign + ".x", PodRef{}, "", false},
		{"sign with the name only", "meshagent.rpc.sign.pod.web-0", PodRef{}, "", false},
		{"event with the name only", "meshagent.evt.pod.web-0", PodRef{}, "", false},
		{"not a pod subject", SubjectCertIssued, PodRef{}, "", false},
		{"bad pod token", "meshagent.evt.pod.shop.-x.up", PodRef{}, "", false},
		{"bad namespace token", "meshagent.evt.pod.Shop.x.up", PodRef{}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := PodFromSubject(tc.subject)
			if got != tc.pod || ok != tc.ok {
				t.Fatalf("PodFromSubject(%q) = %v %v, want %v %v", tc.subject, got, ok, tc.pod, tc.ok)
			}
			if kind, _ := PodEventKind(tc.subject); kind != tc.kind {
				t.Fatalf("PodEventKind(%q) = %q, want %q", tc.subject, kind, tc.kind)
			}
		})
	}
	if _, err := PodSignSubject(PodRef{Namespace: "shop", Name: "a.b*"}); err == nil {
		t.Fatal("wildcard pod accepted")
	}
	if w := PodEventWildcard(PodEventDown); w != "meshagent.evt.pod.*.*.down" {
		t.Fatalf("wildcard %s", w)
	}
	if in, err := PodInboxPrefix(pod); err != nil || in != "_INBOX.pod.shop.web-0~shop" {
		t.Fatalf("inbox %q, %v", in, err)
	}
}

// Two pods of the same name in two namespaces never share a subject.
func TestPodSubjectsSeparateNamespaces(t *testing.T) {
	a, b := PodRef{Namespace: "default", Name: "demo-1"}, PodRef{Namespace: "attacker", Name: "demo-1"}
	for _, f := range []func(PodRef) (string, error){
		PodSignSubject, PodRenewSubject, PodAnchorsSubject, PodEventsOf, PodInboxPrefix,
		func(p PodRef) (string, error) { return PodEventSubject(p, PodEventDown) },
		func(p PodRef) (string, error) { return IdentitySignSubject(p, "sa") },
	} {
		sa, _ := f(a)
		sb, _ := f(b)
		if sa == "" || sa == sb {
			t.Fatalf("%q and %q", sa, sb)
		}
	}
}

func TestParsePodRef(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PodRef
		ok   bool
	}{
		{"demo-1", PodRef{"default", "demo-1"}, true},
		{"attacker/demo-1", PodRef{"attacker", "demo-1"}, true},
		{"shop/web-0.shop", PodRef{"shop", "web-0.shop"}, true},
		{"", PodRef{}, false},
		{"/demo-1", PodRef{}, false},
		{"ns/", PodRef{}, false},
		{"a/b/c", PodRef{}, false},
		{"Shop/web-0", PodRef{}, false},
		{"sh.op/web-0", PodRef{}, false},
		{"shop/web*", PodRef{}, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePodRef(tc.in)
			if got != tc.want || (err == nil) != tc.ok {
				t.Fatalf("ParsePodRef(%q) = %v, %v", tc.in, got, err)
			}
			if tc.ok && got.String() != strings.TrimPrefix(tc.in, "") && !strings.Contains(tc.in, "/") && got.String() != "default/"+tc.in {
				t.Fatalf("String() = %q", got.String())
			}
		})
	}
}

// On the wire a pod is "<namespace>/<name>" and nothing else: a bare name does not
// decode to the default namespace, it fails validation.
func TestPodRefWire(t *testing.T) {
	b, err := json.Marshal(PodDown{Pod: PodRef{"attacker", "demo-1"}})
	if err != nil || !strings.Contains(string(b), `"pod":"attacker/demo-1"`) {
		t.Fatalf("marshal: %s %v", b, err)
	}
	var back PodDown
	if err := json.Unmarshal(b, &back); err != nil || back.Pod != (PodRef{"attacker", "demo-1"}) {
		t.Fatalf("round trip: %v %v", back, err)
	}
	var bare PodDown
	if err := json.Unmarshal([]byte(`{"pod":"demo-1"}`), &bare); err != nil {
		t.Fatal(err)
	}
	if err := bare.Validate(); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("a bare pod name validated: %v", err)
	}
	// A sign request without a pod leaves it out.
	r, _ := json.Marshal(SignRequest{CSR: "x", Token: "t"})
	if strings.Contains(string(r), `"pod"`) {
		t.Fatalf("empty pod encoded: %s", r)
	}
}

func TestIdentitySignSubjectRoundTrip(t *testing.T) {
	pod := PodRef{Namespace: "shop", Name: "web-0.shop"}
	s, err := IdentitySignSubject(pod, "web")
	if err != nil || s != "meshagent.rpc.sign.id.shop.web.web-0~shop" {
		t.Fatalf("got %q, %v", s, err)
	}
	if got, sa, ok := IdentityFromSignSubject(s); !ok || got != pod || sa != "web" {
		t.Fatalf("round trip: %v %q %v", got, sa, ok)
	}
	// Names that are no single token are refused, never escaped.
	for _, bad := range [][3]string{{"sh.op", "web", "p"}, {"shop", "w.eb", "p"}, {"shop", "*", "p"}, {"shop", ">", "p"}, {"", "web", "p"}, {"shop", "web", "p~"}, {"shop", "a b", "p"}} {
		if s, err := IdentitySignSubject(PodRef{Namespace: bad[0], Name: bad[2]}, bad[1]); err == nil {
			t.Errorf("%q: got subject %q, want an error", bad, s)
		}
	}
	for _, subject := range []string{
		"meshagent.rpc.sign.id.shop.web", "meshagent.rpc.sign.id.shop.web.p.x", "meshagent.rpc.sign.pod.shop.web-0",
		"meshagent.rpc.sign.id.shop.*.p", "meshagent.rpc.sign.id..web.p", "meshagent.rpc.sign.any",
	} {
		if _, _, ok := IdentityFromSignSubject(subject); ok {
			t.Errorf("%q read as an identity sign subject", subject)
		}
	}
}

func TestTrustFederatedSubject(t *testing.T) {
	s, err := TrustFederatedSubject("west.example")
	if err != nil || s != "meshagent.evt.trust.federated.west~example" {
		t.Fatalf("subject = %q, %v", s, err)
	}
	for _, bad := range []string{"", "a b", "a.>", "a*"} {
		if _, err := TrustFederatedSubject(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}
