package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// typedDecoders decodes a message with Decode[T] for each known type, so that the
// fuzzer can check that the typed decoder agrees with DecodeAny.
var typedDecoders = map[string]func(*nats.Msg) (Payload, Meta, error){
	TypeCertIssued:      decodeAs[CertIssued],
	TypeTrustChanged:    decodeAs[TrustChanged],
	TypeSignRequest:     decodeAs[SignRequest],
	TypeSignReply:       decodeAs[SignReply],
	TypeBundleRequest:   decodeAs[BundleRequest],
	TypeBundleReply:     decodeAs[BundleReply],
	TypeRotateRequest:   decodeAs[RotateRequest],
	TypeRotateReply:     decodeAs[RotateReply],
	TypeRenewDue:        decodeAs[RenewDue],
	TypeSecretPushed:    decodeAs[SecretPushed],
	TypeSDSNack:         decodeAs[SDSNack],
	TypePodUp:           decodeAs[PodUp],
	TypePodDown:         decodeAs[PodDown],
	TypeXDSConnected:    decodeAs[XDSConnected],
	TypeXDSDisconnected: decodeAs[XDSDisconnected],
	TypeXDSNack:         decodeAs[XDSNack],
	TypeXDSAcked:        decodeAs[XDSAcked],
	TypeTrustAnchors:    decodeAs[TrustAnchors],
	TypeEnvoyStarted:    decodeAs[EnvoyStarted],
	TypeEnvoyReady:      decodeAs[EnvoyReady],
	TypeEnvoyDraining:   decodeAs[EnvoyDraining],
	TypeEnvoyExited:     decodeAs[EnvoyExited],
	TypeCertExpiring:    decodeAs[CertExpiring],
	TypePodParts:        decodeAs[PodParts],
	TypeTrustFederated:  decodeAs[TrustFederated],
	TypeSignerPing:      decodeAs[SignerPing],
	TypeSignerPong:      decodeAs[SignerPong],
}

func decodeAs[T Payload](m *nats.Msg) (Payload, Meta, error) {
	p, meta, err := Decode[T](m)
	return p, meta, err
}

// fuzzMsg builds a message from fuzzed attribute headers (empty: absent) and a body
// followed by pad spaces; pad is ignored beyond twice the size limit, to keep
// iterations small.
func fuzzMsg(spec, id, source, typ, ctime, subject, ctype string, body []byte, pad uint32) *nats.Msg {
	m := nats.NewMsg("meshagent.evt.fuzz")
	for k, v := range map[string]string{HeaderSpecVersion: spec, HeaderID: id, HeaderSource: source, HeaderType: typ,
		HeaderTime: ctime, HeaderSubject: subject, HeaderContentType: ctype} {
		if v != "" {
			m.Header.Set(k, v)
		}
	}
	m.Data = body
	if pad <= 2*MaxEventSize {
		m.Data = append(bytes.Clone(body), bytes.Repeat([]byte{' '}, int(pad))...)
	}
	return m
}

// FuzzDecode feeds arbitrary CloudEvents attribute headers and bodies to Peek,
// DecodeAny and Decode[T]. Seeds: every sample payload as Encode writes it, plus
// padded, untimed, offset-timed, unknown-type and malformed variants.
//
// Properties: no panic; a body over MaxEventSize is always refused with ErrTooLarge;
// DecodeAny and the typed Decode agree; an accepted event has a valid payload of
// the type it names; and it encodes again (Encode) and decodes to an equal payload
// and equal attributes, unless its encoding has grown past MaxEventSize (escaping,
// invalid UTF-8), when Encode must refuse it with ErrTooLarge.
func FuzzDecode(f *testing.F) {
	known := KnownTypes()
	if len(typedDecoders) != len(known) {
		f.Fatalf("typedDecoders has %d types, the registry %d: add the new type to fuzz_test.go", len(typedDecoders), len(known))
	}
	for _, typ := range known {
		if typedDecoders[typ] == nil {
			f.Fatalf("no typed decoder for %s: add it to fuzz_test.go", typ)
		}
	}
	for _, s := range samples {
		m, err := Encode("meshagent.evt.fuzz", Meta{Source: "meshagent/test", ID: "id1", Subject: "web-0", Time: t0}, s)
		if err != nil {
			f.Fatal(err)
		}
		if _, _, err := DecodeAny(m); err != nil {
			f.Fatalf("seed %s does not decode: %v", s.EventType(), err) // the properties below would check nothing
		}
		h := func(k string) string { return m.Header.Get(k) }
		add := func(ctime, ctype string, body []byte, pad uint32) {
			f.Add(h(HeaderSpecVersion), h(HeaderID), h(HeaderSource), h(HeaderType), ctime, h(HeaderSubject), ctype, body, pad)
		}
		add(h(HeaderTime), h(HeaderContentType), m.Data, uint32(0))
		add("", "", m.Data, uint32(0))
		add("2026-11-22T11:00:00.123456789+01:00", ContentTypeJSON, m.Data, uint32(3))
		add(h(HeaderTime), ContentTypeJSON, m.Data, uint32(MaxEventSize-len(m.Data)))   // exactly at the limit
		add(h(HeaderTime), ContentTypeJSON, m.Data, uint32(MaxEventSize-len(m.Data)+1)) // one byte over
	}
	ci := samples[0]
	m, _ := Encode("s", Meta{Source: "meshagent/test", ID: "id1", Time: t0}, ci)
	for _, v := range []struct {
		spec, typ, ctime, ctype string
		body                    string
	}{
		{"0.3", TypeCertIssued, "", "", string(m.Data)},
		{SpecVersion, "io.meshagent.cert.issued.v2", "", "", string(m.Data)},
		{SpecVersion, TypeCertIssued, "yesterday", "", string(m.Data)},
		{SpecVersion, TypeCertIssued, "", "text/xml", string(m.Data)},
		{SpecVersion, TypeCertIssued, "", "", string(m.Data) + "{}"},
		{SpecVersion, TypeCertIssued, "", "", "null"},
		{SpecVersion, TypeCertIssued, "", "", "[]"},
		{SpecVersion, TypeCertIssued, "", "", `{"serial":"1","serial":5}`},
		{SpecVersion, TypeBundleRequest, "", "", "{}"},
		{SpecVersion, TypeBundleRequest, "", "", " {\"x\":\"\\ud800\"} "},
		{SpecVersion, TypeRotateRequest, "", "", `{"new_key":true,"reason":"<\u2028&>"}`},
		{SpecVersion, TypePodDown, "", "", "{\"POD\":\"web-0\",\"Reason\":\"\xff\"}"},
		// TTLs that must be refused at decode, not wrapped by a multiply.
		{SpecVersion, TypeSignRequest, "", "", signReqJSON("9223372036854775807")},
		{SpecVersion, TypeSignRequest, "", "", signReqJSON("9223372037")},
		{SpecVersion, TypeSignRequest, "", "", signReqJSON("9223372036")},
		{SpecVersion, TypeSignRequest, "", "", signReqJSON("-1")},
		{SpecVersion, TypeSignRequest, "", "", signReqJSON("1.5")},
		// Bodies within the limit whose encoding is not (see the property below).
		{SpecVersion, TypePodDown, "", "", `{"pod":"web-0","reason":"` + strings.Repeat("<", 11000) + `"}`},
		{SpecVersion, TypePodDown, "", "", `{"pod":"web-0","reason":"` + strings.Repeat("\xff", 22000) + `"}`},
	} {
		f.Add(v.spec, "id1", "meshagent/test", v.typ, v.ctime, "", v.ctype, []byte(v.body), uint32(0))
	}

	f.Fuzz(func(t *testing.T, spec, id, source, typ, ctime, subject, ctype string, body []byte, pad uint32) {
		msg := fuzzMsg(spec, id, source, typ, ctime, subject, ctype, body, pad)
		p, meta, err := DecodeAny(msg)
		_, peekErr := Peek(msg)
		if (peekErr != nil) && (err == nil) {
			t.Fatalf("Peek refused (%v) what DecodeAny accepted", peekErr)
		}
		if len(msg.Data) > MaxEventSize {
			if !errors.Is(err, ErrTooLarge) || !errors.Is(peekErr, ErrTooLarge) {
				t.Fatalf("%d-byte body: DecodeAny %v, Peek %v; want ErrTooLarge", len(msg.Data), err, peekErr)
			}
		}
		for name, dec := range typedDecoders {
			tp, _, terr := dec(msg)
			if name != meta.Type { // also when the envelope was refused: meta is then empty
				if terr == nil {
					t.Fatalf("Decode[%s] accepted an event of type %q (DecodeAny: %v)", name, meta.Type, err)
				}
				continue
			}
			if (terr == nil) != (err == nil) {
				t.Fatalf("Decode[%s] says %v, DecodeAny says %v", name, terr, err)
			}
			if err == nil && !reflect.DeepEqual(tp, p) {
				t.Fatalf("Decode[%s] = %#v, DecodeAny = %#v", name, tp, p)
			}
		}
		if err != nil {
			for _, want := range []error{ErrTooLarge, ErrNotEvent, ErrUnknownType, ErrInvalid} {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("error %v wraps none of the decode errors", err)
		}

		// Accepted.
		if p.EventType() != meta.Type || meta.ID == "" || meta.Source == "" {
			t.Fatalf("accepted %T as type %q, id %q, source %q", p, meta.Type, meta.ID, meta.Source)
		}
		if verr := p.Validate(); verr != nil {
			t.Fatalf("accepted an invalid payload: %v", verr)
		}
		again, err := Encode("meshagent.evt.fuzz", meta, p)
		if errors.Is(err, ErrTooLarge) {
			// Encoding can grow a body that decoded within the limit: '<', '>' and '&'
			// become \u003c, an invalid UTF-8 byte becomes U+FFFD (3 bytes). Encode then
			// refuses it, which is allowed only when the encoding really is too large.
			if b, _ := json.Marshal(p); len(b) <= MaxEventSize {
				t.Fatalf("Encode says too large for a %d-byte body: %v", len(b), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("accepted event does not encode again: %v", err)
		}
		p2, meta2, err := DecodeAny(again)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v\nheaders %v\nbody %s", err, again.Header, again.Data)
		}
		if !reflect.DeepEqual(p2, p) {
			t.Fatalf("round trip changed the payload:\n%#v\n%#v", p, p2)
		}
		sameTime := meta.Time.IsZero() || meta2.Time.Equal(meta.Time)
		if meta2.ID != meta.ID || meta2.Source != meta.Source || meta2.Type != meta.Type || meta2.Subject != meta.Subject || !sameTime {
			t.Fatalf("round trip changed the attributes:\n%+v\n%+v", meta, meta2)
		}
	})
}
