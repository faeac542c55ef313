package events

import "testing"

// TestReplicaSignSubjects: a replica sign subject carries its sign subject whole
// and gives back exactly it; the permission pattern of one sign subject matches its
// replica forms and no other sign subject's; names that are not one token, and
// subjects that are not sign subjects, are refused.
func TestReplicaSignSubjects(t *testing.T) {
	id, _ := IdentitySignSubject(PodRef{Namespace: "shop", Name: "web-0.v2"}, "web")
	pod, _ := PodSignSubject(PodRef{Namespace: "shop", Name: "web-0"})
	for _, sign := range []string{id, pod, SubjectSignAny} {
		r, err := ReplicaSignSubject("signer-1", sign)
		if err != nil {
			t.Fatal(err)
		}
		back, replica, ok := SignSubjectOfReplica(r)
		if !ok || back != sign || replica != "signer-1" {
			t.Fatalf("%s: back %q %q %v", r, back, replica, ok)
		}
		if !subjectMatches(ReplicaSignPattern(sign), r) {
			t.Fatalf("pattern %s does not match %s", ReplicaSignPattern(sign), r)
		}
		if !subjectMatches(SignerReplicaWildcard, r) || !subjectMatches(ReplicaSignWildcard("signer-1"), r) || subjectMatches(ReplicaSignWildcard("signer-2"), r) {
			t.Fatalf("%s: the signers' wildcards disagree", r)
		}
		if subjectMatches(SignWildcard, r) {
			t.Fatalf("%s is also a sign subject: the queue group would get it too", r)
		}
	}
	other, _ := IdentitySignSubject(PodRef{Namespace: "shop", Name: "web-1"}, "web")
	if r, _ := ReplicaSignSubject("signer-1", other); subjectMatches(ReplicaSignPattern(id), r) {
		t.Fatalf("the pattern of %s matches another pod's %s", id, r)
	}
	for _, bad := range []struct{ replica, sign string }{
		{"signer.1", id}, {"", id}, {"*", id}, {">", id}, {"signer-1", SubjectTrustBundle}, {"signer-1", "other.rpc.sign.any"},
	} {
		if s, err := ReplicaSignSubject(bad.replica, bad.sign); err == nil {
			t.Errorf("ReplicaSignSubject(%q, %q) = %q, want an error", bad.replica, bad.sign, s)
		}
	}
	for _, s := range []string{SubjectSignerPing, "meshagent.rpc.signer.x", "meshagent.rpc.signer.x.trust.bundle", "meshagent.rpc.signer.*.sign.any", id} {
		if _, _, ok := SignSubjectOfReplica(s); ok {
			t.Errorf("%s read as a replica sign subject", s)
		}
	}
}

// subjectMatches is NATS subject matching (* one token, > the rest).
func subjectMatches(pattern, subject string) bool {
	p, s := splitTokens(pattern), splitTokens(subject)
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || tok != "*" && tok != s[i] {
			return false
		}
	}
	return len(p) == len(s)
}

func splitTokens(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
