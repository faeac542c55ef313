package relay

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// frame is one ADS message kept in its wire form. The relay reads only the few
// top-level fields it needs (type URL, nonce, version, error detail, node) and
// forwards the bytes untouched, so a 10 MB response is copied, never re-encoded.
type frame struct {
	b []byte
}

// codec moves frames as raw bytes. It is named "proto" so that the content type on
// the wire stays application/grpc+proto: peers see ordinary ADS messages.
type codec struct{}

var _ encoding.CodecV2 = codec{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("relay codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("relay codec: cannot unmarshal into %T", v)
	}
	f.b = data.Materialize()
	return nil
}

// Field numbers of the ADS messages, from envoy/service/discovery/v3/discovery.proto.
type fieldNums struct {
	version, node, typeURL, nonce, errorDetail protowire.Number
}

var (
	sotwRequest   = fieldNums{version: 1, node: 2, typeURL: 4, nonce: 5, errorDetail: 6}
	sotwResponse  = fieldNums{version: 1, typeURL: 4, nonce: 5}
	deltaRequest  = fieldNums{node: 1, typeURL: 2, nonce: 6, errorDetail: 7}
	deltaResponse = fieldNums{version: 1, typeURL: 4, nonce: 5}
)

// header is what the relay reads from a frame. Byte fields alias the frame (they
// are a copy when a message field occurs more than once).
type header struct {
	Version     string
	TypeURL     string
	Nonce       string
	Node        []byte // a serialized envoy.config.core.v3.Node, if present
	ErrorDetail []byte // a serialized google.rpc.Status, if present (a NACK)
}

// parse reads the top-level fields named by n, skipping everything else. A message
// field that occurs more than once is merged, as protobuf decoders (and so the
// upstream) merge it.
func parse(b []byte, n fieldNums) (header, error) {
	var h header
	var ownNode, ownDetail bool
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return h, fmt.Errorf("parse ads message: %w", protowire.ParseError(l))
		}
		b = b[l:]
		if typ != protowire.BytesType {
			l = protowire.ConsumeFieldValue(num, typ, b)
			if l < 0 {
				return h, fmt.Errorf("parse ads message: %w", protowire.ParseError(l))
			}
			b = b[l:]
			continue
		}
		v, l := protowire.ConsumeBytes(b)
		if l < 0 {
			return h, fmt.Errorf("parse ads message field %d: %w", num, protowire.ParseError(l))
		}
		b = b[l:]
		switch num {
		case 0:
		case n.version:
			h.Version = string(v)
		case n.typeURL:
			h.TypeURL = string(v)
		case n.nonce:
			h.Nonce = string(v)
		case n.node:
			h.Node, ownNode = merge(h.Node, v, ownNode)
		case n.errorDetail:
			h.ErrorDetail, ownDetail = merge(h.ErrorDetail, v, ownDetail)
		}
	}
	return h, nil
}

// merge adds another occurrence v of a message field to prev: the concatenation of
// two encodings is the encoding of their merge. The first occurrence aliases the
// frame; later ones go to a copy (owned), so the frame is never written.
func merge(prev, v []byte, owned bool) ([]byte, bool) {
	if prev == nil {
		return v, false
	}
	if !owned {
		prev = append(make([]byte, 0, len(prev)+len(v)), prev...)
	}
	return append(prev, v...), true
}
