package events

import (
	"errors"
	"reflect"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecodeCompact feeds arbitrary bodies to the compact sign request and reply
// decoders. Seeds: a full request, a reply and an error reply as the encoders write
// them, plus truncated and retyped variants.
//
// Properties: no panic; a body over MaxEventSize is refused with ErrTooLarge; every
// error is one of the decode errors; an accepted request or reply is valid, and it
// encodes again (compact) and decodes to an equal payload (a reply with an error:
// the error).
func FuzzDecodeCompact(f *testing.F) {
	req, err := NewSignRequestMsg("s", EncodingCompact, "fuzz", fullSignRequest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(req.Data)
	f.Add(req.Data[:len(req.Data)/2])
	for _, rep := range []SignReply{fullSignReply(), {Error: &ReplyError{Code: CodeInternal, Message: "x"}}} {
		m, err := NewSignReplyMsg("s", EncodingCompact, "fuzz", rep)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(m.Data)
		f.Add(append([]byte(compactPrefix(TypeSignRequest)), m.Data[len(compactPrefix(TypeSignReply)):]...))
	}
	f.Add([]byte("\x00io.meshagent.sign.request.v1\x00\x0a\x80"))
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 || body[0] != 0 {
			body = append([]byte{0}, body...)
		}
		m := &nats.Msg{Subject: "s", Data: body}
		check := func(err error) {
			t.Helper()
			if len(body) > MaxEventSize && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%d bytes: %v, want ErrTooLarge", len(body), err)
			}
			if err != nil && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrNotEvent) && !errors.Is(err, ErrUnknownType) &&
				!errors.Is(err, ErrWrongType) && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error of no decode kind: %v", err)
			}
		}
		if r, enc, err := DecodeSignRequest(m); err == nil {
			if enc != EncodingCompact || r.Validate() != nil {
				t.Fatalf("accepted %+v as %s", r, enc)
			}
			again, err := NewSignRequestMsg("s", EncodingCompact, "fuzz", r)
			if err != nil {
				t.Fatalf("accepted request does not encode again: %v", err)
			}
			if r2, _, err := DecodeSignRequest(again); err != nil || !reflect.DeepEqual(r, r2) {
				t.Fatalf("round trip: %+v, %v; want %+v", r2, err, r)
			}
		} else {
			check(err)
		}
		if r, enc, err := DecodeSignReply(m); err == nil {
			if enc != EncodingCompact || r.Validate() != nil {
				t.Fatalf("accepted %+v as %s", r, enc)
			}
			again, err := NewSignReplyMsg("s", EncodingCompact, "fuzz", r)
			if err != nil {
				t.Fatalf("accepted reply does not encode again: %v", err)
			}
			r2, _, err := DecodeSignReply(again)
			if r.Error != nil {
				r = SignReply{Error: r.Error}
			}
			if err != nil || !reflect.DeepEqual(r, r2) {
				t.Fatalf("round trip: %+v, %v; want %+v", r2, err, r)
			}
		} else {
			check(err)
		}
	})
}
