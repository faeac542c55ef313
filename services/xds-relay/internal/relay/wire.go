package relay

import (
	"io"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// wire reads protobuf wire format from a message held in several buffers (gRPC
// receives a large message as one buffer per HTTP/2 frame) without joining them:
// only a tag or length split across two buffers is gathered, into a few bytes on
// the stack, and only a wanted value split across two is copied.
type wire struct {
	cur  []byte          // the unread part of the current buffer
	rest mem.BufferSlice // the buffers after it
	left int             // unread bytes in all
}

func newWire(data mem.BufferSlice) wire {
	return wire{rest: data, left: data.Len()}
}

// done reports whether everything has been read, moving to the next non-empty
// buffer when the current one is.
func (w *wire) done() bool {
	for len(w.cur) == 0 {
		if len(w.rest) == 0 {
			return true
		}
		w.cur, w.rest = w.rest[0].ReadOnlyData(), w.rest[1:]
	}
	return false
}

// skip moves past n bytes; n is at most w.left.
func (w *wire) skip(n int) {
	w.left -= n
	for n > 0 && !w.done() {
		k := min(n, len(w.cur))
		w.cur, n = w.cur[k:], n-k
	}
}

// take reads n bytes (at most w.left): a slice of the current buffer when they
// are all in it (copied false), else a copy.
func (w *wire) take(n int) (b []byte, copied bool) {
	if n == 0 {
		return []byte{}, false
	}
	w.done()
	if n <= len(w.cur) {
		b, w.cur = w.cur[:n:n], w.cur[n:]
		w.left -= n
		return b, false
	}
	b = make([]byte, 0, n)
	for len(b) < n {
		w.done()
		k := min(n-len(b), len(w.cur))
		b, w.cur = append(b, w.cur[:k]...), w.cur[k:]
	}
	w.left -= n
	return b, true
}

// peek copies the next bytes, up to len(buf), without reading them.
func (w *wire) peek(buf []byte) int {
	n := copy(buf, w.cur)
	for _, b := range w.rest {
		if n == len(buf) {
			break
		}
		n += copy(buf[n:], b.ReadOnlyData())
	}
	return n
}

// prefix applies consume (a protowire Consume function of a tag or a varint) to
// the next bytes, gathering them when they straddle two buffers, and moves past
// what it consumed. It returns consume's length or its negative error code.
func (w *wire) prefix(consume func([]byte) int) int {
	if w.done() {
		return consume(nil)
	}
	if l := consume(w.cur); l >= 0 || len(w.cur) >= protowire.SizeVarint(1<<63) {
		if l >= 0 {
			w.cur, w.left = w.cur[l:], w.left-l
		}
		return l
	}
	var buf [10]byte // the longest varint
	l := consume(buf[:w.peek(buf[:])])
	if l >= 0 {
		w.skip(l)
	}
	return l
}

func (w *wire) tag() (protowire.Number, protowire.Type, error) {
	var num protowire.Number
	var typ protowire.Type
	if l := w.prefix(func(b []byte) (l int) { num, typ, l = protowire.ConsumeTag(b); return l }); l < 0 {
		return 0, 0, protowire.ParseError(l)
	}
	return num, typ, nil
}

func (w *wire) varint() (uint64, error) {
	var v uint64
	if l := w.prefix(func(b []byte) (l int) { v, l = protowire.ConsumeVarint(b); return l }); l < 0 {
		return 0, protowire.ParseError(l)
	}
	return v, nil
}

// skipValue moves past the value of a field of type typ (not BytesType). Groups
// and invalid types, which ADS messages never hold at the top level, are handed
// to protowire whole.
func (w *wire) skipValue(num protowire.Number, typ protowire.Type) error {
	switch typ {
	case protowire.VarintType:
		_, err := w.varint()
		return err
	case protowire.Fixed32Type, protowire.Fixed64Type:
		n := 4
		if typ == protowire.Fixed64Type {
			n = 8
		}
		if n > w.left {
			return io.ErrUnexpectedEOF
		}
		w.skip(n)
		return nil
	}
	rest, _ := w.take(w.left)
	l := protowire.ConsumeFieldValue(num, typ, rest)
	if l < 0 {
		return protowire.ParseError(l)
	}
	*w = wire{cur: rest[l:], left: len(rest) - l}
	return nil
}
