package events

import "testing"

// Every event subject the package names lands in exactly one stream: the CA's
// history or the pods' events. A CA event kind added without its prefix in
// CAEventSubjects would be kept nowhere.
func TestCAEventSubjectsCoverEveryEvent(t *testing.T) {
	fed, err := TrustFederatedSubject("example.org")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := PodEventSubject(PodRef{Namespace: "default", Name: "demo-1"}, PodEventDown)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ subject, stream string }{
		{SubjectCertIssued, StreamEvents},
		{SubjectTrustChanged, StreamEvents},
		{SubjectRenewSent, StreamEvents},
		{fed, StreamEvents},
		{pod, StreamPodEvents},
		{SubjectSignAny, ""},
		{Prefix + ".evt.podx.up", ""},
	} {
		if got := StreamOf(tc.subject); got != tc.stream {
			t.Errorf("StreamOf(%s) = %q, want %q", tc.subject, got, tc.stream)
		}
	}
}
