package xdswire

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// Codec is the gRPC codec of this package's messages. It is named "proto" so
// that the content type on the wire stays application/grpc+proto: peers see
// ordinary xDS messages. It is never registered (that would replace gRPC's proto
// codec for the whole process): a server forces it with grpc.ForceServerCodecV2,
// a client per call with grpc.ForceCodecV2.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Name implements encoding.CodecV2.
func (Codec) Name() string { return "proto" }

// Marshal implements encoding.CodecV2.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(Message)
	if !ok {
		return nil, fmt.Errorf("xdswire codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.AppendWire(nil))}, nil
}

// Unmarshal implements encoding.CodecV2. The message aliases a copy of data.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(Message)
	if !ok {
		return fmt.Errorf("xdswire codec: cannot unmarshal into %T", v)
	}
	return m.UnmarshalWire(data.Materialize())
}
