package kubernetes_test

import "testing"

// TestNetworkPoliciesAdmitTheOperatorToTheBus: the operator's inventory and
// dashboard read the bus, so under an enforcing CNI the nats policy must admit
// it on the client port (issue 37: it admitted the signer, the rotator and
// injected pods only), and nothing more: not the cluster port, not the CA.
// TestNetworkPolicies' matrix, for the operator.
func TestNetworkPoliciesAdmitTheOperatorToTheBus(t *testing.T) {
	inv, err := decodeAll(build(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*workload{}
	for _, w := range inv.workloads {
		byName[w.name] = w
	}
	op := byName["operator"]
	if op == nil {
		t.Fatal("no operator workload in base")
	}
	src := peer{op.name, op.namespace, op.labels}
	for _, c := range []struct {
		dst  string
		port string
		want bool
	}{
		{"nats", "client", true},
		{"nats", "cluster", false},
		{"signer", "grpc-ca", false},
	} {
		if got := reaches(t, inv.policies, src, byName[c.dst], c.port); got != c.want {
			t.Errorf("operator -> %s:%s: allowed %v, want %v", c.dst, c.port, got, c.want)
		}
	}
}
