package democp

import (
	"context"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/nds"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

func TestServesListenerAndCluster(t *testing.T) {
	tests := []struct {
		name  string
		nodes []string
		node  string
	}{
		{"named node", []string{"sidecar~web-0"}, "sidecar~web-0"},
		{"any node", nil, "whoever"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Config{Addr: "127.0.0.1:0", NodeIDs: tt.nodes}, hclog.NewNullLogger())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			}()
			select {
			case <-s.Bound():
			case <-time.After(5 * time.Second):
				t.Fatal("not bound")
			}
			cc, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			defer scancel()
			st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
			if err != nil {
				t.Fatal(err)
			}
			get := func(typeURL string, first bool, into proto.Message) {
				t.Helper()
				req := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL}
				if first {
					req.Node = &corev3.Node{Id: tt.node}
				}
				if err := st.Send(req); err != nil {
					t.Fatal(err)
				}
				r, err := st.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if r.GetTypeUrl() != typeURL || len(r.GetResources()) != 1 || r.GetVersionInfo() != "1" {
					t.Fatalf("%s: type %s, %d resources, version %q", typeURL, r.GetTypeUrl(), len(r.GetResources()), r.GetVersionInfo())
				}
				if err := r.GetResources()[0].UnmarshalTo(into); err != nil {
					t.Fatal(err)
				}
			}
			var c clusterv3.Cluster
			get(resource.ClusterType, true, &c)
			if c.GetName() != ClusterName {
				t.Fatalf("cluster %q", c.GetName())
			}
			var l listenerv3.Listener
			get(resource.ListenerType, false, &l)
			if l.GetName() != ListenerName || l.GetAddress().GetSocketAddress().GetPortValue() != DefaultListenerPort {
				t.Fatalf("listener %q at %v", l.GetName(), l.GetAddress())
			}
			// The name table, as Istio's agent asks for it: no resource names.
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: nds.TypeURL}); err != nil {
				t.Fatal(err)
			}
			r, err := st.Recv()
			if err != nil || r.GetTypeUrl() != nds.TypeURL || len(r.GetResources()) != 1 {
				t.Fatalf("name table: %v, %d resources, %v", r.GetTypeUrl(), len(r.GetResources()), err)
			}
			nt, err := nds.Unmarshal(r.GetResources()[0].GetValue())
			if err != nil {
				t.Fatal(err)
			}
			if e := nt[BackendHost]; len(e.IPs) != 1 || e.IPs[0] != "127.0.0.1" || e.Shortname != BackendShortName || e.Namespace != "default" {
				t.Fatalf("name table %#v", nt)
			}
		})
	}
}

func TestSnapshotRejectsBadBackend(t *testing.T) {
	if _, err := Snapshot("1", 1, "nohostport"); err == nil {
		t.Fatal("want error for a backend without a port")
	}
	if _, err := NameTable("backend.example:80"); err == nil {
		t.Fatal("want error for a name table of a backend without an address")
	}
}
