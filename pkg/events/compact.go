package events

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// The compact encoding of sign requests and replies: what a pod and a signer
// exchange on the sign subjects (meshagent.rpc.sign.>) instead of a CloudEvent, to
// spend the signer's CPU on signing. Events on meshagent.evt.> stay CloudEvents
// JSON for audit subscribers; the JSON form of the request and reply stays
// accepted, and a signer answers in the form it was asked in, so pods and signers
// of either kind work together during a rolling upgrade.
//
// A compact message has no headers. Its body is a NUL, the payload's CloudEvents
// type (io.meshagent.sign.request.v1: the same type, the same meaning, the same
// validation as the JSON form), a NUL, then the fields in the protobuf wire format
// (only varint and length-delimited fields; protoc --decode_raw reads them), at
// most MaxEventSize bytes in all. Certificates and CSRs travel as DER, not PEM; the
// decoder turns them back into the PEM strings of SignRequest and SignReply, so that
// everything after decoding is the same for both forms. Unknown fields are skipped
// (an optional new field keeps the version, as with JSON); a known field repeated
// that may appear once, a field of the wrong wire type, a truncated field, an
// unknown type or an oversized body is an error wrapping ErrInvalid, ErrUnknownType,
// ErrWrongType or ErrTooLarge.
//
//	SignRequest: 1 csr (DER), 2 token, 3 cert_chain (DER, repeated), 4 proof,
//	             5 ttl_seconds (varint), 6 pod, 7 resource, 8 key_algorithm, 9 cert_signer,
//	             10 deadline_unix_ms (varint: when the requester stops waiting)
//	SignReply:   1 cert_chain (DER, repeated, leaf first), 2 roots (DER, repeated),
//	             3 trust_domain, 4 generation (varint), 5 endorsements (repeated
//	             message: 1 key_id, 2 signature, 3 chain (DER, repeated)),
//	             6 error (message: 1 code, 2 message)

// Encoding is the form of a sign request or reply on the bus.
type Encoding int

const (
	// EncodingJSON is a CloudEvent with a JSON body (pkg/events' envelope).
	EncodingJSON Encoding = iota
	// EncodingCompact is the compact body described above.
	EncodingCompact
)

func (e Encoding) String() string {
	if e == EncodingCompact {
		return "compact"
	}
	return "json"
}

// ParseEncoding reads "json" or "compact".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "json":
		return EncodingJSON, nil
	case "compact":
		return EncodingCompact, nil
	}
	return 0, fmt.Errorf("encoding %q: want json or compact", s)
}

// Protobuf wire types used by the compact encoding.
const (
	wireVarint = 0
	wireBytes  = 2
)

func compactPrefix(typ string) string { return "\x00" + typ + "\x00" }

// IsCompact reports whether msg carries a compact body (and no CloudEvent).
func IsCompact(msg *nats.Msg) bool {
	return msg != nil && len(msg.Data) > 0 && msg.Data[0] == 0 && msg.Header.Get(HeaderSpecVersion) == ""
}

// compactBody checks the size and the type of a compact body and returns its fields.
func compactBody(data []byte, want string) ([]byte, error) {
	if len(data) > MaxEventSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), MaxEventSize)
	}
	if len(data) == 0 || data[0] != 0 {
		return nil, fmt.Errorf("%w: not a compact body", ErrNotEvent)
	}
	end := bytes.IndexByte(data[1:], 0)
	if end < 0 {
		return nil, fmt.Errorf("%w: compact body without its type", ErrNotEvent)
	}
	typ := string(data[1 : 1+end])
	if typ != want {
		if _, ok := registry[typ]; !ok {
			return nil, fmt.Errorf("%w: %q", ErrUnknownType, typ)
		}
		return nil, fmt.Errorf("%w: got %q, want %q", ErrWrongType, typ, want)
	}
	return data[2+end:], nil
}

// field is one decoded field: its number and either its varint or its bytes.
type field struct {
	num   uint64
	wire  uint64
	u     uint64
	bytes []byte
}

// nextField reads the field at the start of b and returns the rest.
func nextField(b []byte) (field, []byte, error) {
	key, n := binary.Uvarint(b)
	if n <= 0 {
		return field{}, nil, errors.New("bad field key")
	}
	f := field{num: key >> 3, wire: key & 7}
	if f.num == 0 {
		return field{}, nil, errors.New("field number 0")
	}
	b = b[n:]
	switch f.wire {
	case wireVarint:
		if f.u, n = binary.Uvarint(b); n <= 0 {
			return field{}, nil, fmt.Errorf("field %d: bad varint", f.num)
		}
		return f, b[n:], nil
	case wireBytes:
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return field{}, nil, fmt.Errorf("field %d: truncated", f.num)
		}
		f.bytes = b[n : n+int(l)]
		return f, b[n+int(l):], nil
	case 1: // fixed64
		if len(b) < 8 {
			return field{}, nil, fmt.Errorf("field %d: truncated", f.num)
		}
		return f, b[8:], nil
	case 5: // fixed32
		if len(b) < 4 {
			return field{}, nil, fmt.Errorf("field %d: truncated", f.num)
		}
		return f, b[4:], nil
	}
	return field{}, nil, fmt.Errorf("field %d: unsupported wire type %d", f.num, f.wire)
}

// fieldReader walks a message's fields, checking wire types and that a field
// meant to appear once does. Its first error sticks.
type fieldReader struct {
	seen uint64 // bit n: field n (< 64) was read
	err  error
}

// each calls f for every field of b; unknown fields are for f to ignore.
func (r *fieldReader) each(b []byte, f func(field)) {
	for len(b) > 0 && r.err == nil {
		var fl field
		fl, b, r.err = nextField(b)
		if r.err == nil {
			f(fl)
		}
	}
}

// sub reads f's bytes as a message of its own (what) with read; its error, also r's.
func (r *fieldReader) sub(f field, what string, read func(sr *fieldReader, g field)) error {
	var sr fieldReader
	sr.each(f.bytes, func(g field) { read(&sr, g) })
	if sr.err != nil {
		r.fail(f, "%s: %v", what, sr.err)
	}
	return sr.err
}

func (r *fieldReader) fail(f field, format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("field %d: %s", f.num, fmt.Sprintf(format, a...))
	}
}

// once checks that f (< 64) has wire type wire and was not seen before.
func (r *fieldReader) once(f field, wire uint64) bool {
	if !r.is(f, wire) {
		return false
	}
	if r.seen&(1<<f.num) != 0 {
		r.fail(f, "repeated")
		return false
	}
	r.seen |= 1 << f.num
	return true
}

func (r *fieldReader) is(f field, wire uint64) bool {
	if f.wire != wire {
		r.fail(f, "wire type %d, want %d", f.wire, wire)
		return false
	}
	return true
}

func (r *fieldReader) str(f field, dst *string) {
	if r.once(f, wireBytes) {
		*dst = string(f.bytes)
	}
}

// der appends f's DER bytes as a PEM block of type typ to dst.
func (r *fieldReader) der(f field, typ string, dst *[]string) {
	if r.is(f, wireBytes) {
		if len(f.bytes) == 0 {
			r.fail(f, "empty %s", strings.ToLower(typ))
			return
		}
		*dst = append(*dst, pemString(typ, f.bytes))
	}
}

// pemString is the PEM block of der (pem.EncodeToMemory without headers) built in
// one allocation: the compact decoder turns every DER field back into the PEM
// strings of the payload types.
func pemString(typ string, der []byte) string {
	var b strings.Builder
	n := base64.StdEncoding.EncodedLen(len(der))
	b.Grow(len("-----BEGIN -----\n-----END -----\n") + 2*len(typ) + n + (n+63)/64)
	b.WriteString("-----BEGIN " + typ + "-----\n")
	var line [64]byte
	for len(der) > 0 {
		k := min(48, len(der)) // 48 bytes: one 64-character line
		base64.StdEncoding.Encode(line[:], der[:k])
		b.Write(line[:base64.StdEncoding.EncodedLen(k)])
		b.WriteByte('\n')
		der = der[k:]
	}
	b.WriteString("-----END " + typ + "-----\n")
	return b.String()
}

// appendBytes appends field num with bytes v.
func appendBytes(b []byte, num uint64, v []byte) []byte {
	b = binary.AppendUvarint(b, num<<3|wireBytes)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendString(b []byte, num uint64, v string) []byte {
	if v == "" {
		return b
	}
	b = binary.AppendUvarint(b, num<<3|wireBytes)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendVarint(b []byte, num, v uint64) []byte {
	if v == 0 {
		return b
	}
	return binary.AppendUvarint(binary.AppendUvarint(b, num<<3|wireVarint), v)
}

// appendPEMs appends each PEM certificate of pems as field num (DER).
func appendPEMs(b []byte, num uint64, pems []string, what string) ([]byte, error) {
	for i, p := range pems {
		blk, rest := pem.Decode([]byte(p))
		if blk == nil || blk.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
			return nil, fmt.Errorf("%w: %s[%d]: not one PEM certificate", ErrInvalid, what, i)
		}
		b = appendBytes(b, num, blk.Bytes)
	}
	return b, nil
}

func newCompactMsg(subject string, body []byte) (*nats.Msg, error) {
	if len(body) > MaxEventSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(body), MaxEventSize)
	}
	return &nats.Msg{Subject: subject, Data: body}, nil
}
