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
