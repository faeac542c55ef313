package events

import "testing"

func TestNodeSignSubjects(t *testing.T) {
	pod := PodRef{Namespace: "shop", Name: "web-0.v2"}
	subj, err := NodeSignSubject("ip-10-0-0-1.ec2.internal", pod)
	if err != nil {
		t.Fatal(err)
	}
	if subj != "meshagent.rpc.sign.node.ip-10-0-0-1~ec2~internal.shop.web-0~v2" {
		t.Fatalf("subject %q", subj)
	}
	node, got, ok := NodeFromSignSubject(subj)
	if !ok || node != "ip-10-0-0-1.ec2.internal" || got != pod {
		t.Fatalf("NodeFromSignSubject = %q %v %v", node, got, ok)
	}
	// Its replica form carries it whole, and is read back by the replica's inverse.
	rs, err := ReplicaSignSubject("signer-1", subj)
	if err != nil {
		t.Fatal(err)
	}
	if back, _, ok := SignSubjectOfReplica(rs); !ok || back != subj {
		t.Fatalf("replica form %q read back as %q", rs, back)
	}
	for name, s := range map[string]string{
		"pod subject":      "meshagent.rpc.sign.pod.shop.web-0",
		"missing pod":      "meshagent.rpc.sign.node.n1.shop",
		"extra token":      "meshagent.rpc.sign.node.n1.shop.web-0.x",
		"bad node":         "meshagent.rpc.sign.node.-n1.shop.web-0",
		"bad namespace":    "meshagent.rpc.sign.node.n1.Shop_.web-0",
		"wildcard as node": "meshagent.rpc.sign.node.*.shop.web-0",
	} {
		if n, p, ok := NodeFromSignSubject(s); ok {
			t.Errorf("%s: %q read as node %q pod %v", name, s, n, p)
		}
	}
	for _, bad := range []string{"", "-a", "a b", "a*", "a>"} {
		if _, err := NodeSignSubject(bad, pod); err == nil {
			t.Errorf("node %q accepted", bad)
		}
	}
	if _, ok := PodFromSubject(subj); ok {
		t.Errorf("a node sign subject read as a pod subject")
	}
}
