// Package xdswire reads and writes, straight on the protobuf wire, the few xDS
// messages the pod's roles speak: discovery requests and responses (state of the
// world and delta), the SDS Secret, and the Node, google.rpc.Status and Any inside
// them — so that sds-edge, xds-relay and the launcher do not link
// go-control-plane's generated Envoy types. Registering those descriptors at init
// costs every process ~5 MB of code pages and ~2 MB of heap (docs/benchmarks.md,
// "Per-pod memory"); these messages need a few hundred lines.
//
// Decoding follows protobuf's rules: unknown fields and fields of an unexpected
// wire type are skipped, the last occurrence of a scalar wins, occurrences of a
// message field merge, and strings must be valid UTF-8 (the protos are proto3).
// Encoding writes fields in number order and leaves out empty proto3 values.
// The tests check every message against go-control-plane's generated types.
package xdswire

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Any is google.protobuf.Any.
type Any struct {
	TypeURL string
	Value   []byte
}

// Status is google.rpc.Status without its details (an xDS error_detail).
type Status struct {
	Code    int32
	Message string
}

// Field is one field of a message: a length-delimited field's payload (aliasing
// the message) in Bytes, a varint's or fixed value's in Num, and the whole field,
// tag included, in Raw (for copying it unchanged).
type Field struct {
	Num   protowire.Number
	Type  protowire.Type
	Bytes []byte
	Uint  uint64
	Raw   []byte
}

// Fields calls fn for every field of the message b. It stops at the first error,
// fn's or a malformed field's.
func Fields(b []byte, fn func(Field) error) error {
	for len(b) > 0 {
		start := b
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		f := Field{Num: num, Type: typ}
		switch typ {
		case protowire.BytesType:
			f.Bytes, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			f.Uint, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		f.Raw = start[:len(start)-len(b)]
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// String is a length-delimited field's payload as a string, checked as UTF-8
// (proto3 strings must be).
func (f Field) String() (string, error) {
	if !utf8.Valid(f.Bytes) {
		return "", fmt.Errorf("field %d: %w", f.Num, errUTF8)
	}
	return string(f.Bytes), nil
}

// appendString appends the string payload of f to ss.
func (f Field) appendString(ss *[]string) error {
	s, err := f.String()
	if err == nil {
		*ss = append(*ss, s)
	}
	return err
}

// Is reports whether f is field num of wire type typ. A field of the right
// number but another wire type is skipped, as protobuf skips it (unknown).
func (f Field) Is(num protowire.Number, typ protowire.Type) bool {
	return f.Num == num && f.Type == typ
}

// errUTF8 is what a string field that is not UTF-8 fails with.
var errUTF8 = errors.New("string field contains invalid UTF-8")

// AppendString appends field num with s; an empty s is left out (proto3).
func AppendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// AppendStrings appends one field num per element of ss, empty ones included
// (a repeated field keeps them).
func AppendStrings(b []byte, num protowire.Number, ss []string) []byte {
	for _, s := range ss {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b
}

// AppendBytes appends field num with v, even when v is empty (for a member of a
// oneof, which is present once set).
func AppendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// AppendMessage appends the message field num whose body enc appends: the body
// is written in place after a length prefix sized for it.
func AppendMessage(b []byte, num protowire.Number, enc func([]byte) []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	body := enc(nil)
	b = protowire.AppendVarint(b, uint64(len(body)))
	return append(b, body...)
}

// AppendAny appends a as the message field num.
func AppendAny(b []byte, num protowire.Number, a Any) []byte {
	return AppendMessage(b, num, a.append)
}

func (a Any) append(b []byte) []byte {
	b = AppendString(b, 1, a.TypeURL)
	if len(a.Value) > 0 {
		b = AppendBytes(b, 2, a.Value)
	}
	return b
}

// DecodeAny decodes a google.protobuf.Any; Value aliases b.
func DecodeAny(b []byte) (Any, error) {
	var a Any
	if err := a.merge(b); err != nil {
		return Any{}, fmt.Errorf("decode Any: %w", err)
	}
	return a, nil
}

// merge decodes b into a, as protobuf decodes another occurrence of a message field.
func (a *Any) merge(b []byte) error {
	return Fields(b, func(f Field) error {
		var err error
		switch {
		case f.Is(1, protowire.BytesType):
			a.TypeURL, err = f.String()
		case f.Is(2, protowire.BytesType):
			a.Value = f.Bytes
		}
		return err
	})
}

// appendStatus appends s as the message field num; nil appends nothing.
func appendStatus(b []byte, num protowire.Number, s *Status) []byte {
	if s == nil {
		return b
	}
	return AppendMessage(b, num, func(b []byte) []byte {
		if s.Code != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(s.Code)))
		}
		return AppendString(b, 2, s.Message)
	})
}

// DecodeStatus decodes a google.rpc.Status (its details are skipped).
func DecodeStatus(b []byte) (Status, error) {
	var s Status
	if err := decodeStatus(b, &s); err != nil {
		return Status{}, fmt.Errorf("decode Status: %w", err)
	}
	return s, nil
}

// mergeStatus merges the google.rpc.Status b into *s, making it first if nil.
func mergeStatus(s **Status, b []byte) error {
	if *s == nil {
		*s = &Status{}
	}
	return decodeStatus(b, *s)
}

// decodeStatus merges the google.rpc.Status b into s (its details are skipped).
func decodeStatus(b []byte, s *Status) error {
	return Fields(b, func(f Field) error {
		var err error
		switch {
		case f.Is(1, protowire.VarintType):
			s.Code = int32(f.Uint)
		case f.Is(2, protowire.BytesType):
			s.Message, err = f.String()
		}
		return err
	})
}

// Split separates the message b into its fields other than the length-delimited
// field num, copied unchanged into rest, and that field's payloads concatenated
// in merged: for a message field, what protobuf decodes as the merge of its
// occurrences. present says whether the field occurs. A field num of another
// wire type is no occurrence (protobuf keeps it as unknown) and stays in rest.
func Split(b []byte, num protowire.Number) (rest, merged []byte, present bool, err error) {
	err = Fields(b, func(f Field) error {
		if f.Is(num, protowire.BytesType) {
			merged, present = append(merged, f.Bytes...), true
		} else {
			rest = append(rest, f.Raw...)
		}
		return nil
	})
	return rest, merged, present, err
}
