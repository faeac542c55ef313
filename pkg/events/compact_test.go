package events

import (
	"encoding/binary"
	"encoding/pem"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// pemOf wraps der (any bytes: the codec does not parse certificates) as PEM.
func pemOf(typ string, der ...byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func fullSignRequest() SignRequest {
	return SignRequest{
		CSR: pemOf("CERTIFICATE REQUEST", 0x30, 1, 2, 3), Token: "eyJ.x.y",
		CertChain: []string{pemOf("CERTIFICATE", 0x30, 9), pemOf("CERTIFICATE", 0x30, 8)}, Proof: "c2ln",
		TTL: 90 * time.Minute, Pod: web0, Resource: "default", KeyAlgorithm: "EC-P256", CertSigner: "clusterA",
		Deadline: time.Date(2026, 11, 27, 5, 30, 1, 123e6, time.UTC),
	}
}

func fullSignReply() SignReply {
	return SignReply{
		CertChain:   []string{pemOf("CERTIFICATE", 0x30, 1), pemOf("CERTIFICATE", 0x30, 2), pemOf("CERTIFICATE", 0x30, 3)},
		Roots:       []string{pemOf("CERTIFICATE", 0x30, 3), pemOf("CERTIFICATE", 0x30, 4)},
		TrustDomain: "cluster.local", Generation: 7,
		Endorsements: []Endorsement{{KeyID: "ab", Signature: "c2ln"}, {KeyID: "cd", Signature: "c2ln", Chain: []string{pemOf("CERTIFICATE", 0x30, 2)}}},
		Signer: &SignerRoots{Name: "partner", Roots: []string{pemOf("CERTIFICATE", 0x30, 5)},
			Endorsements: []Endorsement{{KeyID: "ef", Signature: "c2ln", Chain: []string{pemOf("CERTIFICATE", 0x30, 2)}}}},
	}
}

// TestCompactSignRoundTrip: a request and a reply decode from the compact form to
// exactly what they decode to from JSON, and each is answered in its own form.
func TestCompactSignRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{EncodingJSON, EncodingCompact} {
		t.Run(enc.String(), func(t *testing.T) {
			req := fullSignRequest()
			m, err := NewSignRequestMsg("meshagent.rpc.sign.any", enc, "test", req)
			if err != nil {
				t.Fatal(err)
			}
			if IsCompact(m) != (enc == EncodingCompact) {
				t.Fatalf("IsCompact = %v for %s", IsCompact(m), enc)
			}
			got, genc, err := DecodeSignRequest(m)
			if err != nil || genc != enc || !reflect.DeepEqual(got, req) {
				t.Fatalf("request: got %+v, %s, %v; want %+v, %s", got, genc, err, req, enc)
			}
			for _, rep := range []SignReply{fullSignReply(), {Error: &ReplyError{Code: CodePermissionDenied, Message: "no"}},
				{Error: &ReplyError{Code: CodeUnavailable, Message: "busy", RetryAfterMillis: 2500}}} {
				rm, err := NewSignReplyMsg("_INBOX.x", enc, "test", rep)
				if err != nil {
					t.Fatal(err)
				}
				got, genc, err := DecodeSignReply(rm)
				if err != nil || genc != enc || !reflect.DeepEqual(got, rep) {
					t.Fatalf("reply: got %+v, %s, %v; want %+v", got, genc, err, rep)
				}
			}
		})
	}
}

// TestCompactSignReplyTail: a signer's reply built from a tail encoded once is the
// reply NewSignReplyMsg makes, and a tail without a root or above-leaf certificate
// is refused.
func TestCompactSignReplyTail(t *testing.T) {
	want := fullSignReply()
	tail, err := NewSignReplyTail(want.CertChain[1:], want.Roots, want.TrustDomain, want.Generation, want.Endorsements, want.Signer)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := pem.Decode([]byte(want.CertChain[0]))
	m, err := NewCompactSignReply("_INBOX.x", leaf.Bytes, tail)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := NewSignReplyMsg("_INBOX.x", EncodingCompact, "test", want)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != string(ref.Data) || m.Header != nil {
		t.Fatalf("tail reply differs from the whole one:\n%q\n%q", m.Data, ref.Data)
	}
	if _, err := NewSignReplyTail(nil, want.Roots, "td", 1, nil, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("tail without a chain: %v, want ErrInvalid", err)
	}
	if _, err := NewSignReplyTail(want.Roots, []string{"not pem"}, "td", 1, nil, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("tail with a bad root: %v, want ErrInvalid", err)
	}
	if _, err := NewSignReplyTail(want.Roots, want.Roots, "td", 1, nil, &SignerRoots{Name: "partner", Roots: want.Roots}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("tail with unendorsed signer roots: %v, want ErrInvalid", err)
	}
}

// compactMsg is a raw compact message of type typ with fields.
func compactMsg(typ string, fields ...[]byte) *nats.Msg {
	b := []byte(compactPrefix(typ))
	for _, f := range fields {
		b = append(b, f...)
	}
	return &nats.Msg{Subject: "s", Data: b}
}

func bytesField(num uint64, v string) []byte { return appendBytes(nil, num, []byte(v)) }
func varintField(num, v uint64) []byte {
	return binary.AppendUvarint(binary.AppendUvarint(nil, num<<3|wireVarint), v)
}

// TestCompactSignRequestRefused: bad input gets a clear error of the right kind.
func TestCompactSignRequestRefused(t *testing.T) {
	csr, tok := bytesField(1, "\x30\x01\x02"), bytesField(2, "eyJ.x.y")
	tests := []struct {
		name string
		msg  *nats.Msg
		is   error
		says string
	}{
		{"oversized", compactMsg(TypeSignRequest, csr, tok, bytesField(99, strings.Repeat("x", MaxEventSize))), ErrTooLarge, "limit"},
		{"unknown type", compactMsg("io.meshagent.nothing.v9", csr, tok), ErrUnknownType, "nothing"},
		{"another known type", compactMsg(TypeSignReply, csr, tok), ErrWrongType, TypeSignReply},
		{"no type", &nats.Msg{Data: []byte("\x00abc")}, ErrNotEvent, "type"},
		{"no credential", compactMsg(TypeSignRequest, csr), ErrInvalid, "token"},
		{"no csr", compactMsg(TypeSignRequest, tok), ErrInvalid, "csr"},
		{"empty csr", compactMsg(TypeSignRequest, bytesField(1, ""), tok), ErrInvalid, "empty csr"},
		{"csr twice", compactMsg(TypeSignRequest, csr, csr, tok), ErrInvalid, "repeated"},
		{"token as a varint", compactMsg(TypeSignRequest, csr, varintField(2, 5)), ErrInvalid, "wire type"},
		{"truncated", compactMsg(TypeSignRequest, csr, tok, []byte{2<<3 | wireBytes, 50, 'x'}), ErrInvalid, "truncated"},
		{"bad key", compactMsg(TypeSignRequest, csr, tok, []byte{0x80}), ErrInvalid, "key"},
		{"field zero", compactMsg(TypeSignRequest, csr, tok, []byte{0, 0}), ErrInvalid, "field number 0"},
		{"group wire type", compactMsg(TypeSignRequest, csr, tok, []byte{10<<3 | 3}), ErrInvalid, "wire type 3"},
		{"ttl too large", compactMsg(TypeSignRequest, csr, tok, varintField(5, 1<<62)), ErrInvalid, "ttl_seconds"},
		{"bad pod", compactMsg(TypeSignRequest, csr, tok, bytesField(6, "web 0")), ErrInvalid, "pod"},
		{"chain without proof", compactMsg(TypeSignRequest, csr, bytesField(3, "\x30")), ErrInvalid, "proof"},
		{"deadline zero", compactMsg(TypeSignRequest, csr, tok, varintField(10, 0)), ErrInvalid, "deadline_unix_ms"},
		{"deadline past year 9999", compactMsg(TypeSignRequest, csr, tok, varintField(10, 1<<60)), ErrInvalid, "deadline_unix_ms"},
		{"deadline twice", compactMsg(TypeSignRequest, csr, tok, varintField(10, 5), varintField(10, 6)), ErrInvalid, "repeated"},
		{"empty chain entry", compactMsg(TypeSignRequest, csr, tok, bytesField(3, ""), bytesField(4, "c2ln")), ErrInvalid, "empty certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodeSignRequest(tc.msg)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want %v saying %q", err, tc.is, tc.says)
			}
		})
	}
}

// TestCompactUnknownFieldsIgnored: fields a newer peer adds (any wire type this
// encoding can skip) are ignored, as unknown JSON fields are.
func TestCompactUnknownFieldsIgnored(t *testing.T) {
	fixed64 := append([]byte{12<<3 | 1}, make([]byte, 8)...)
	fixed32 := append([]byte{13<<3 | 5}, make([]byte, 4)...)
	m := compactMsg(TypeSignRequest, bytesField(1, "\x30\x01"), varintField(40, 3), bytesField(2, "eyJ.x.y"), bytesField(41, "later"), fixed64, fixed32)
	req, _, err := DecodeSignRequest(m)
	if err != nil || req.Token != "eyJ.x.y" {
		t.Fatalf("got %+v, %v", req, err)
	}
}

// TestCompactSignReplyRefused: a reply that is not a valid one is refused.
func TestCompactSignReplyRefused(t *testing.T) {
	leaf, root := bytesField(1, "\x30\x01"), bytesField(2, "\x30\x02")
	tests := []struct {
		name string
		msg  *nats.Msg
		says string
	}{
		{"one certificate", compactMsg(TypeSignReply, leaf, root), "cert_chain"},
		{"no root", compactMsg(TypeSignReply, leaf, leaf), "roots"},
		{"error without a code", compactMsg(TypeSignReply, bytesField(6, string(bytesField(2, "boom")))), "error.code"},
		{"two errors", compactMsg(TypeSignReply, bytesField(6, string(bytesField(1, "x"))), bytesField(6, string(bytesField(1, "y")))), "repeated"},
		{"garbled endorsement", compactMsg(TypeSignReply, leaf, leaf, root, bytesField(5, "\x0a\x09")), "endorsement"},
		{"generation twice", compactMsg(TypeSignReply, leaf, leaf, root, varintField(4, 1), varintField(4, 2)), "repeated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodeSignReply(tc.msg)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want ErrInvalid saying %q", err, tc.says)
			}
		})
	}
}

// TestCompactNotForOtherEvents: a JSON CloudEvent whose body happens to start with
// NUL is still read as a CloudEvent (and refused as such), never as compact.
func TestCompactNotForOtherEvents(t *testing.T) {
	m, err := NewMsg("s", "test", fullSignRequest())
	if err != nil {
		t.Fatal(err)
	}
	m.Data = append([]byte{0}, m.Data...)
	if IsCompact(m) {
		t.Fatal("a CloudEvent counted as compact")
	}
	if _, enc, err := DecodeSignRequest(m); enc != EncodingJSON || !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %s, %v", enc, err)
	}
}

// TestPEMString: the decoder's PEM is encoding/pem's, for every length across
// several lines.
func TestPEMString(t *testing.T) {
	der := make([]byte, 200)
	for i := range der {
		der[i] = byte(i * 13)
	}
	for n := range len(der) + 1 {
		if got, want := pemString("CERTIFICATE", der[:n]), pemOf("CERTIFICATE", der[:n]...); got != want {
			t.Fatalf("%d bytes: got %q, want %q", n, got, want)
		}
	}
}
