package relay

import (
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

const adsService = "envoy.service.discovery.v3.AggregatedDiscoveryService"

// mode is what differs between state-of-the-world and delta ADS.
type mode struct {
	name      string // "sotw" or "delta", as in events.XDSConnected.Mode
	method    string // full gRPC method name
	req, resp fieldNums
	// subscribe is the relay's own request for an agent-consumed type.
	subscribe func(typeURL string) proto.Message
	// reply ACKs (detail nil) or NACKs a consumed response.
	reply func(h header, detail *statuspb.Status) proto.Message
	// resources decodes a consumed response's resources.
	resources func(b []byte) ([]*anypb.Any, error)
}

var sotw = mode{
	name:   "sotw",
	method: "/" + adsService + "/StreamAggregatedResources",
	req:    sotwRequest,
	resp:   sotwResponse,
	subscribe: func(t string) proto.Message {
		return &discoveryv3.DiscoveryRequest{TypeUrl: t}
	},
	reply: func(h header, d *statuspb.Status) proto.Message {
		return &discoveryv3.DiscoveryRequest{TypeUrl: string(h.TypeURL), VersionInfo: string(h.Version), ResponseNonce: string(h.Nonce), ErrorDetail: d}
	},
	resources: func(b []byte) ([]*anypb.Any, error) {
		var r discoveryv3.DiscoveryResponse
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("decode discovery response: %w", err)
		}
		return r.Resources, nil
	},
}

var delta = mode{
	name:   "delta",
	method: "/" + adsService + "/DeltaAggregatedResources",
	req:    deltaRequest,
	resp:   deltaResponse,
	subscribe: func(t string) proto.Message {
		return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t}
	},
	reply: func(h header, d *statuspb.Status) proto.Message {
		return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: string(h.TypeURL), ResponseNonce: string(h.Nonce), ErrorDetail: d}
	},
	resources: func(b []byte) ([]*anypb.Any, error) {
		var r discoveryv3.DeltaDiscoveryResponse
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("decode delta discovery response: %w", err)
		}
		out := make([]*anypb.Any, 0, len(r.Resources))
		for _, res := range r.Resources {
			if res.GetResource() != nil {
				out = append(out, res.GetResource())
			}
		}
		return out, nil
	},
}
