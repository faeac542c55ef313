package relay

import (
	"reflect"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// fuzzKind is one ADS message type with the field numbers parse reads from it, and
// what a full proto decode says those fields are.
type fuzzKind struct {
	name   string
	nums   fieldNums
	msg    func() proto.Message
	fields map[string]protowire.Number // proto field name -> the number in nums
	want   func(m proto.Message) fields
}

// fields is what parse read, as values.
type fields struct {
	Version, TypeURL, Nonce string
	Node, ErrorDetail       []byte
}

func fieldsOf(h header) fields {
	return fields{Version: string(h.Version), TypeURL: string(h.TypeURL), Nonce: string(h.Nonce), Node: h.Node, ErrorDetail: h.ErrorDetail}
}

// pieces is raw in buffers that end at the given offsets, as gRPC hands a message
// over in one buffer per HTTP/2 frame.
func pieces(raw []byte, cuts ...int) mem.BufferSlice {
	var out mem.BufferSlice
	last := 0
	for _, c := range append(cuts, len(raw)) {
		c = max(last, min(c, len(raw)))
		out = append(out, mem.SliceBuffer(raw[last:c]))
		last = c
	}
	return out
}

var fuzzKinds = []fuzzKind{
	{"sotw request", sotwRequest, func() proto.Message { return &discoveryv3.DiscoveryRequest{} },
		map[string]protowire.Number{"version_info": sotwRequest.version, "node": sotwRequest.node, "type_url": sotwRequest.typeURL,
			"response_nonce": sotwRequest.nonce, "error_detail": sotwRequest.errorDetail},
		func(m proto.Message) fields {
			r := m.(*discoveryv3.DiscoveryRequest)
			return fields{Version: r.GetVersionInfo(), TypeURL: r.GetTypeUrl(), Nonce: r.GetResponseNonce(),
				Node: fuzzMarshal(r.GetNode()), ErrorDetail: fuzzMarshal(r.GetErrorDetail())}
		}},
	{"sotw response", sotwResponse, func() proto.Message { return &discoveryv3.DiscoveryResponse{} },
		map[string]protowire.Number{"version_info": sotwResponse.version, "type_url": sotwResponse.typeURL, "nonce": sotwResponse.nonce},
		func(m proto.Message) fields {
			r := m.(*discoveryv3.DiscoveryResponse)
			return fields{Version: r.GetVersionInfo(), TypeURL: r.GetTypeUrl(), Nonce: r.GetNonce()}
		}},
	{"delta request", deltaRequest, func() proto.Message { return &discoveryv3.DeltaDiscoveryRequest{} },
		map[string]protowire.Number{"node": deltaRequest.node, "type_url": deltaRequest.typeURL, "response_nonce": deltaRequest.nonce,
			"error_detail": deltaRequest.errorDetail},
		func(m proto.Message) fields {
			r := m.(*discoveryv3.DeltaDiscoveryRequest)
			return fields{TypeURL: r.GetTypeUrl(), Nonce: r.GetResponseNonce(), Node: fuzzMarshal(r.GetNode()), ErrorDetail: fuzzMarshal(r.GetErrorDetail())}
		}},
	{"delta response", deltaResponse, func() proto.Message { return &discoveryv3.DeltaDiscoveryResponse{} },
		map[string]protowire.Number{"system_version_info": deltaResponse.version, "type_url": deltaResponse.typeURL, "nonce": deltaResponse.nonce},
		func(m proto.Message) fields {
			r := m.(*discoveryv3.DeltaDiscoveryResponse)
			return fields{Version: r.GetSystemVersionInfo(), TypeURL: r.GetTypeUrl(), Nonce: r.GetNonce()}
		}},
}

// fuzzMarshal is m's deterministic encoding, nil for a nil message; a present but
// empty message is an empty, non-nil slice, as parse returns it.
func fuzzMarshal(m proto.Message) []byte {
	if m == nil || !m.ProtoReflect().IsValid() {
		return nil
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err)
	}
	if b == nil {
		b = []byte{}
	}
	return b
}

// sameMessage compares the bytes parse kept for a message field with what a full
// decode made of it, by decoding them into the same type.
func sameMessage(t *testing.T, what string, got, want []byte, newMsg func() proto.Message) {
	t.Helper()
	if (got == nil) != (want == nil) {
		t.Fatalf("%s: parse has %d bytes (nil %t), proto has %d (nil %t)", what, len(got), got == nil, len(want), want == nil)
	}
	if got == nil {
		return
	}
	g, w := newMsg(), newMsg()
	if err := proto.Unmarshal(got, g); err != nil {
		t.Fatalf("%s: the bytes parse kept do not decode: %v", what, err)
	}
	if err := proto.Unmarshal(want, w); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(g, w) {
		t.Fatalf("%s: parse read %v, a full decode reads %v", what, g, w)
	}
}

// FuzzParseFrame checks the relay's raw top-level reader (parse) against full
// protobuf decoding, for each of the four ADS message types. Two inputs: arbitrary
// bytes, and a DiscoveryRequest built from fuzzed fields and encoded by
// proto.Marshal.
//
// Properties: no panic; whenever proto.Unmarshal accepts the bytes, parse accepts
// them too and reads the same version, type URL, nonce, node and error detail (the
// relay forwards those bytes, so what it reports must be what the upstream sees);
// and for a marshalled request, the fields read equal the original.
func FuzzParseFrame(f *testing.F) {
	// The hand-written field numbers must be the descriptors'.
	for _, k := range fuzzKinds {
		fields := k.msg().ProtoReflect().Descriptor().Fields()
		for name, num := range k.fields {
			fd := fields.ByName(protoreflect.Name(name))
			if fd == nil || fd.Number() != num {
				f.Fatalf("%s: field %s is not number %d", k.name, name, num)
			}
		}
	}
	meta, _ := structpb.NewStruct(map[string]any{"ISTIO_VERSION": "1.31.1", "CLUSTER_ID": "Kubernetes"})
	node := &corev3.Node{Id: "sidecar~10.0.0.1~web-0.shop~shop.svc.cluster.local", Cluster: "web.shop", Metadata: meta}
	res, _ := anypb.New(node)
	const cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	for _, m := range []proto.Message{
		&discoveryv3.DiscoveryRequest{VersionInfo: "3", Node: node, ResourceNames: []string{"a", "b"}, TypeUrl: cds, ResponseNonce: "7"},
		&discoveryv3.DiscoveryRequest{VersionInfo: "2", TypeUrl: cds, ResponseNonce: "8", ErrorDetail: &statuspb.Status{Code: 3, Message: "bad cluster"}},
		&discoveryv3.DiscoveryRequest{Node: &corev3.Node{}},
		&discoveryv3.DiscoveryResponse{VersionInfo: "3", Resources: []*anypb.Any{res, res}, TypeUrl: cds, Nonce: "9"},
		&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: cds, ResourceNamesSubscribe: []string{"a"}, InitialResourceVersions: map[string]string{"a": "1"}},
		&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, ResponseNonce: "4", ErrorDetail: &statuspb.Status{Code: 3, Message: "nack"}},
		&discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "5", TypeUrl: cds, Nonce: "6",
			Resources: []*discoveryv3.Resource{{Name: "a", Version: "1", Resource: res}}, RemovedResources: []string{"b"}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "3", cds, "7", node.Id, "", "a\nb")
	}
	f.Add([]byte{}, "", "", "", "", "bad", "")
	f.Add([]byte{0x0a, 0x80}, "\xff", "", "", "", "", "")                            // truncated length
	f.Add([]byte{0x0b, 0x0c}, "", "", "", "", "", "")                                // empty group
	f.Add(protowire.AppendTag(nil, 4, protowire.VarintType), "", "", "", "", "", "") // type_url as a varint, truncated

	f.Fuzz(func(t *testing.T, raw []byte, version, typeURL, nonce, nodeID, errMsg, names string) {
		// Arbitrary bytes: parse must agree with a full decode wherever one succeeds.
		for _, k := range fuzzKinds {
			h, perr := parse(pieces(raw), k.nums)
			// The same bytes in several buffers read the same: split at every byte,
			// and in two at a few places.
			splits := [][]int{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}}
			for _, c := range []int{1, len(raw) / 3, len(raw) / 2, len(raw) - 1} {
				splits = append(splits, []int{c})
			}
			for _, cuts := range splits {
				hs, serr := parse(pieces(raw, cuts...), k.nums)
				if (serr == nil) != (perr == nil) {
					t.Fatalf("%s split at %v: error %v, in one buffer %v", k.name, cuts, serr, perr)
				}
				if perr == nil && !reflect.DeepEqual(fieldsOf(hs), fieldsOf(h)) {
					t.Fatalf("%s split at %v: read %+v, in one buffer %+v", k.name, cuts, fieldsOf(hs), fieldsOf(h))
				}
			}
			m := k.msg()
			if err := proto.Unmarshal(raw, m); err != nil {
				continue // parse may be more lenient (it does not look inside fields)
			}
			if perr != nil {
				t.Fatalf("%s: proto decodes the bytes, parse says %v", k.name, perr)
			}
			want, got := k.want(m), fieldsOf(h)
			if got.Version != want.Version || got.TypeURL != want.TypeURL || got.Nonce != want.Nonce {
				t.Fatalf("%s: parse read version %q type %q nonce %q, a full decode %q %q %q",
					k.name, got.Version, got.TypeURL, got.Nonce, want.Version, want.TypeURL, want.Nonce)
			}
			sameMessage(t, k.name+" node", h.Node, want.Node, func() proto.Message { return &corev3.Node{} })
			sameMessage(t, k.name+" error_detail", h.ErrorDetail, want.ErrorDetail, func() proto.Message { return &statuspb.Status{} })
		}

		// A request from fuzzed fields, as Envoy would send it.
		valid := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
		req := &discoveryv3.DiscoveryRequest{VersionInfo: valid(version), TypeUrl: valid(typeURL), ResponseNonce: valid(nonce)}
		if names != "" {
			req.ResourceNames = strings.Split(valid(names), "\n")
		}
		if nodeID != "" {
			req.Node = &corev3.Node{Id: valid(nodeID), Metadata: meta}
		}
		if errMsg != "" {
			req.ErrorDetail = &statuspb.Status{Code: 3, Message: valid(errMsg)}
		}
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		h, err := parse(pieces(b, len(b)/2), sotwRequest)
		if err != nil {
			t.Fatalf("parse of a marshalled request: %v", err)
		}
		if got := fieldsOf(h); got.Version != req.VersionInfo || got.TypeURL != req.TypeUrl || got.Nonce != req.ResponseNonce {
			t.Fatalf("parse read version %q type %q nonce %q from %v", got.Version, got.TypeURL, got.Nonce, req)
		}
		sameMessage(t, "node", h.Node, fuzzMarshal(req.Node), func() proto.Message { return &corev3.Node{} })
		sameMessage(t, "error_detail", h.ErrorDetail, fuzzMarshal(req.ErrorDetail), func() proto.Message { return &statuspb.Status{} })
	})
}
