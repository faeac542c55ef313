package bus

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestReplication: what a stream's leader reports turns into the replicas that are
// not current — offline, behind, lost (not reported at all), or all of them
// without a leader — and a whole R3 or an R1 stream is healthy.
func TestReplication(t *testing.T) {
	peer := func(name string, current, offline bool) *jetstream.PeerInfo {
		return &jetstream.PeerInfo{Name: name, Current: current, Offline: offline, Active: time.Second, Lag: 7}
	}
	tests := []struct {
		name      string
		replicas  int
		cluster   *jetstream.ClusterInfo
		unhealthy int
		says      string
	}{
		{"R1 alone", 1, nil, 0, ""},
		{"R3 whole", 3, &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer("n2", true, false), peer("n3", true, false)}}, 0, ""},
		{"R3 one offline", 3, &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer("n2", true, false), peer("n3", false, true)}}, 1, "n3 offline"},
		{"R3 one behind", 3, &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer("n2", false, false), peer("n3", true, false)}}, 1, "n2 not current (7 operations behind"},
		{"R3 one lost (JetStream disabled there)", 3, &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer("n2", true, false)}}, 1, "1 replica(s) lost"},
		{"R3 no leader", 3, &jetstream.ClusterInfo{Replicas: []*jetstream.PeerInfo{peer("n2", true, false), peer("n3", true, false)}}, 3, "no leader"},
		{"R3 not clustered", 3, nil, 3, "not clustered"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := replicationOf(&jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: "S", Replicas: tc.replicas}, Cluster: tc.cluster})
			if r.Unhealthy() != tc.unhealthy || r.Healthy() != (tc.unhealthy == 0) {
				t.Fatalf("unhealthy %d (healthy %v), want %d: %s", r.Unhealthy(), r.Healthy(), tc.unhealthy, r)
			}
			if !strings.Contains(r.String(), tc.says) {
				t.Fatalf("%q does not say %q", r.String(), tc.says)
			}
		})
	}
}
