package relay

import (
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/pkg/xdswire"
)

const adsService = "envoy.service.discovery.v3.AggregatedDiscoveryService"

// mode is what differs between state-of-the-world and delta ADS.
type mode struct {
	name      string // "sotw" or "delta", as in events.XDSConnected.Mode
	method    string // full gRPC method name
	req, resp fieldNums
	// subscribe is the relay's own request for an agent-consumed type.
	subscribe func(typeURL string) xdswire.Message
	// reply ACKs (detail nil) or NACKs a consumed response.
	reply func(h header, detail *xdswire.Status) xdswire.Message
	// resources decodes a consumed response's resources.
	resources func(b []byte) ([]*anypb.Any, error)
	// debugRequest asks for a debug type (debug.go); debugResponse reads the
	// answer as a state-of-the-world response.
	debugRequest  func(typeURL string, names []string) xdswire.Message
	debugResponse func(b []byte) (*xdswire.DiscoveryResponse, error)
}

var sotw = mode{
	name:   "sotw",
	method: "/" + adsService + "/StreamAggregatedResources",
	req:    sotwRequest,
	resp:   sotwResponse,
	subscribe: func(t string) xdswire.Message {
		return &xdswire.DiscoveryRequest{TypeURL: t}
	},
	reply: func(h header, d *xdswire.Status) xdswire.Message {
		return &xdswire.DiscoveryRequest{TypeURL: string(h.TypeURL), VersionInfo: string(h.Version), ResponseNonce: string(h.Nonce), ErrorDetail: d}
	},
	resources: func(b []byte) ([]*anypb.Any, error) {
		var r xdswire.DiscoveryResponse
		if err := r.UnmarshalWire(b); err != nil {
			return nil, err
		}
		out := make([]*anypb.Any, len(r.Resources))
		for i, a := range r.Resources {
			out[i] = protoAny(a)
		}
		return out, nil
	},
	debugRequest:  sotwDebugRequest,
	debugResponse: sotwDebugResponse,
}

var delta = mode{
	name:   "delta",
	method: "/" + adsService + "/DeltaAggregatedResources",
	req:    deltaRequest,
	resp:   deltaResponse,
	subscribe: func(t string) xdswire.Message {
		return &xdswire.DeltaDiscoveryRequest{TypeURL: t}
	},
	reply: func(h header, d *xdswire.Status) xdswire.Message {
		return &xdswire.DeltaDiscoveryRequest{TypeURL: string(h.TypeURL), ResponseNonce: string(h.Nonce), ErrorDetail: d}
	},
	resources: func(b []byte) ([]*anypb.Any, error) {
		var r xdswire.DeltaDiscoveryResponse
		if err := r.UnmarshalWire(b); err != nil {
			return nil, err
		}
		out := make([]*anypb.Any, 0, len(r.Resources))
		for _, res := range r.Resources {
			if res.Resource != nil {
				out = append(out, protoAny(*res.Resource))
			}
		}
		return out, nil
	},
	debugRequest:  deltaDebugRequest,
	debugResponse: deltaDebugResponse,
}

// protoAny is a as the protobuf Any the agent's consumers decode.
func protoAny(a xdswire.Any) *anypb.Any { return &anypb.Any{TypeUrl: a.TypeURL, Value: a.Value} }
