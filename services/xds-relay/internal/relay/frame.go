package relay

import (
	"fmt"
	"io"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// frame is one ADS message kept in its wire form: the buffers gRPC received it
// in, or the relay's own encoding. The relay reads only the few top-level fields
// it needs (type URL, nonce, version, error detail, node) and forwards the
// buffers untouched, so a 10 MB response is neither copied nor re-encoded.
//
// A frame holds a reference on its buffers until it is sent (the codec hands the
// reference to gRPC, which releases it once the bytes are written) or freed.
type frame struct {
	data mem.BufferSlice
}

func bytesFrame(b []byte) *frame { return &frame{data: mem.BufferSlice{mem.SliceBuffer(b)}} }

// free releases the frame's buffers if it still holds them.
func (f *frame) free() {
	f.data.Free()
	f.data = nil
}

// bytes is the message in one slice: the buffer itself when it arrived in one,
// else a copy (for the rare frames the relay decodes whole).
func (f *frame) bytes() []byte {
	if len(f.data) == 1 {
		return f.data[0].ReadOnlyData()
	}
	return f.data.Materialize()
}

// codec moves frames as raw bytes. It is named "proto" so that the content type on
// the wire stays application/grpc+proto: peers see ordinary ADS messages.
type codec struct{}

var _ encoding.CodecV2 = codec{}

func (codec) Name() string { return "proto" }

// Marshal hands the frame's buffers, and its reference on them, to gRPC.
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("relay codec: cannot marshal %T", v)
	}
	data := f.data
	f.data = nil
	return data, nil
}

// Unmarshal keeps the received buffers (gRPC releases its own reference when
// Unmarshal returns): nothing is copied.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("relay codec: cannot unmarshal into %T", v)
	}
	data.Ref()
	f.data = data
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

// header is what the relay reads from a frame. Its fields alias the frame's
// buffers (a field split across two buffers, or a message field that occurs more
// than once, is a copy): they are valid while the frame is, and never written.
type header struct {
	Version     []byte
	TypeURL     []byte
	Nonce       []byte
	Node        []byte // a serialized envoy.config.core.v3.Node, if present
	ErrorDetail []byte // a serialized google.rpc.Status, if present (a NACK)
}

// parse reads the top-level fields named by n from a message held in buffers,
// skipping everything else without copying it. A message field that occurs more
// than once is merged, as protobuf decoders (and so the upstream) merge it.
func parse(data mem.BufferSlice, n fieldNums) (header, error) {
	var h header
	var ownNode, ownDetail bool
	w := newWire(data)
	for !w.done() {
		num, typ, err := w.tag()
		if err != nil {
			return h, fmt.Errorf("parse ads message: %w", err)
		}
		if typ != protowire.BytesType {
			if err := w.skipValue(num, typ); err != nil {
				return h, fmt.Errorf("parse ads message: %w", err)
			}
			continue
		}
		l, err := w.varint()
		if err == nil && l > uint64(w.left) {
			err = io.ErrUnexpectedEOF // the value runs past the end
		}
		if err != nil {
			return h, fmt.Errorf("parse ads message field %d: %w", num, err)
		}
		switch num {
		case n.version, n.typeURL, n.nonce, n.node, n.errorDetail:
		default:
			w.skip(int(l))
			continue
		}
		v, copied := w.take(int(l))
		switch num {
		case n.version:
			h.Version = v
		case n.typeURL:
			h.TypeURL = v
		case n.nonce:
			h.Nonce = v
		case n.node:
			h.Node, ownNode = merge(h.Node, v, ownNode, copied)
		case n.errorDetail:
			h.ErrorDetail, ownDetail = merge(h.ErrorDetail, v, ownDetail, copied)
		}
	}
	return h, nil
}

// merge adds another occurrence v of a message field to prev: the concatenation of
// two encodings is the encoding of their merge. An occurrence that aliases the
// frame is never written: appending to it goes to a copy (owned).
func merge(prev, v []byte, owned, copied bool) ([]byte, bool) {
	if prev == nil {
		return v, copied
	}
	if !owned {
		prev = append(make([]byte, 0, len(prev)+len(v)), prev...)
	}
	return append(prev, v...), true
}
