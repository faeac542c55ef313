package standin

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
)

// firstNode is an ADS server that hands on the node of each stream's first request.
type firstNode struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	nodes chan *corev3.Node
}

func (f *firstNode) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	req, err := s.Recv()
	if err != nil {
		return err
	}
	f.nodes <- req.GetNode()
	<-s.Context().Done()
	return nil
}

// The stand-in's first ADS request carries the bootstrap's whole node, metadata
// included, as Envoy's does: istiod reads the proxy's namespace, cluster and
// version from it. Without one, the node is the id and the pod as cluster.
func TestADSSendsTheBootstrapNode(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{"NAMESPACE": "shop", "CLUSTER_ID": "Kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	boot := &corev3.Node{Id: "sidecar~10.0.0.1~web-0.shop~shop.svc.cluster.local", Cluster: "web.shop", Metadata: meta}
	for _, tc := range []struct {
		name string
		node *corev3.Node
		want *corev3.Node
	}{
		{"bootstrap node", boot, boot},
		{"none", nil, &corev3.Node{Id: boot.GetId(), Cluster: "web-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testkit.ShortDir(t), "xds")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			f := &firstNode{nodes: make(chan *corev3.Node, 4)}
			discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, f)
			go func() { _ = srv.Serve(ln) }()
			defer srv.Stop()
			ctx, cancel := context.WithCancel(context.Background())
			e := &streams{Clock: clock.Real{}, Pod: "web-0", NodeID: boot.GetId(), Node: tc.node, XDSSocket: sock,
				Report: func(string) {}, GotSecrets: func([]string) {}, GotConfig: func(string) {}}
			done := make(chan struct{})
			go func() { e.run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			select {
			case got := <-f.nodes:
				if !proto.Equal(got, tc.want) {
					t.Fatalf("first ADS request's node %v, want %v", got, tc.want)
				}
			case <-time.After(testkit.Timeout):
				t.Fatal("no ADS request")
			}
		})
	}
}
