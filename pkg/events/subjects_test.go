package events

import "testing"

func TestPodSubjectsRoundTrip(t *testing.T) {
	sign, _ := PodSignSubject("web-0.shop")
	up, _ := PodEventSubject("web-0.shop", PodEventSecretPushed)
	renew, _ := PodRenewSubject("web-0.shop")
	for _, tc := range []struct {
		name, subject, pod, kind string
		ok                       bool
	}{
		{"sign", sign, "web-0.shop", "", true},
		{"event", up, "web-0.shop", PodEventSecretPushed, true},
		{"command", renew, "web-0.shop", "", true},
		{"sign any", SubjectSignAny, "", "", false},
		{"sign with extra token", sign + ".x", "", "", false},
		{"not a pod subject", SubjectCertIssued, "", "", false},
		{"bad pod token", "meshagent.evt.pod.-x.up", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, ok := PodFromSubject(tc.subject)
			if pod != tc.pod || ok != tc.ok {
				t.Fatalf("PodFromSubject(%q) = %q %v, want %q %v", tc.subject, pod, ok, tc.pod, tc.ok)
			}
			if kind, _ := PodEventKind(tc.subject); kind != tc.kind {
				t.Fatalf("PodEventKind(%q) = %q, want %q", tc.subject, kind, tc.kind)
			}
		})
	}
	if _, err := PodSignSubject("a.b*"); err == nil {
		t.Fatal("wildcard pod accepted")
	}
	if w := PodEventWildcard(PodEventDown); w != "meshagent.evt.pod.*.down" {
		t.Fatalf("wildcard %s", w)
	}
}

func TestIdentitySignSubjectRoundTrip(t *testing.T) {
	s, err := IdentitySignSubject("shop", "web", "web-0.shop")
	if err != nil || s != "meshagent.rpc.sign.id.shop.web.web-0~shop" {
		t.Fatalf("got %q, %v", s, err)
	}
	if ns, sa, pod, ok := IdentityFromSignSubject(s); !ok || ns != "shop" || sa != "web" || pod != "web-0.shop" {
		t.Fatalf("round trip: %q %q %q %v", ns, sa, pod, ok)
	}
	// Names that are no single token are refused, never escaped.
	for _, bad := range [][3]string{{"sh.op", "web", "p"}, {"shop", "w.eb", "p"}, {"shop", "*", "p"}, {"shop", ">", "p"}, {"", "web", "p"}, {"shop", "web", "p~"}, {"shop", "a b", "p"}} {
		if s, err := IdentitySignSubject(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("%q: got subject %q, want an error", bad, s)
		}
	}
	for _, subject := range []string{
		"meshagent.rpc.sign.id.shop.web", "meshagent.rpc.sign.id.shop.web.p.x", "meshagent.rpc.sign.pod.web-0",
		"meshagent.rpc.sign.id.shop.*.p", "meshagent.rpc.sign.id..web.p", "meshagent.rpc.sign.any",
	} {
		if _, _, _, ok := IdentityFromSignSubject(subject); ok {
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
