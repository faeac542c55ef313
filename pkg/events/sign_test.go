package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

const testCSR = "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"

// signReqJSON is a sign request body with ttl_seconds set to the JSON number n.
func signReqJSON(n string) string {
	return `{"csr":` + quote(testCSR) + `,"token":"eyJ.x.y","ttl_seconds":` + n + `}`
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// TestSignRequestTTLOnTheWire: TTL is a Duration in Go and whole seconds on the
// wire, under the name every released sds-edge and signer use (ttl_seconds), so an
// old peer's request decodes. That an old peer reads a new one's is pinned by the
// golden file (testdata/golden/sign.request.v1.json), unchanged by the Duration.
func TestSignRequestTTLOnTheWire(t *testing.T) {
	tests := []struct {
		name    string
		ttl     string // ttl_seconds as sent; "" leaves it out
		want    time.Duration
		wantErr string
	}{
		{name: "a day, as an old sds-edge sends it", ttl: "86400", want: 24 * time.Hour},
		{name: "absent: the signer's default", want: 0},
		{name: "zero: the signer's default", ttl: "0", want: 0},
		{name: "the largest a Duration holds", ttl: "9223372036", want: 9223372036 * time.Second},
		{name: "one more would wrap", ttl: "9223372037", wantErr: "ttl_seconds"},
		{name: "max int64 would wrap", ttl: "9223372036854775807", wantErr: "ttl_seconds"},
		{name: "beyond int64", ttl: "1e30", wantErr: "ttl_seconds"},
		{name: "negative", ttl: "-1", wantErr: "ttl_seconds"},
		{name: "not whole seconds", ttl: "1.5", wantErr: "ttl_seconds"},
		{name: "a string", ttl: `"3600"`, wantErr: "ttl_seconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"csr":` + quote(testCSR) + `,"token":"eyJ.x.y"}`
			if tc.ttl != "" {
				body = signReqJSON(tc.ttl)
			}
			m := nats.NewMsg("s")
			m.Header.Set(HeaderSpecVersion, SpecVersion)
			m.Header.Set(HeaderID, "id1")
			m.Header.Set(HeaderSource, "test")
			m.Header.Set(HeaderType, TypeSignRequest)
			m.Data = []byte(body)
			got, _, err := Decode[SignRequest](m)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("decode ttl_seconds %s: %v, want an ErrInvalid naming %q", tc.ttl, err, tc.wantErr)
				}
				return
			}
			if err != nil || got.TTL != tc.want {
				t.Fatalf("decode ttl_seconds %s = %v, %v; want %v", tc.ttl, got.TTL, err, tc.want)
			}
		})
	}
}

func TestSignRequestEncodesWholeSeconds(t *testing.T) {
	tests := []struct {
		ttl  time.Duration
		want string // the ttl_seconds member, "" for none
	}{
		{ttl: 24 * time.Hour, want: `"ttl_seconds":86400`},
		{ttl: 90*time.Second + 500*time.Millisecond, want: `"ttl_seconds":90`},
		{ttl: 0, want: ""},
	}
	for _, tc := range tests {
		b, err := json.Marshal(SignRequest{CSR: testCSR, Token: "t", TTL: tc.ttl})
		if err != nil {
			t.Fatal(err)
		}
		if tc.want == "" && strings.Contains(string(b), "ttl") || tc.want != "" && !strings.Contains(string(b), tc.want) {
			t.Fatalf("TTL %v encodes as %s, want %q", tc.ttl, b, tc.want)
		}
		var back SignRequest
		if err := json.Unmarshal(b, &back); err != nil || back.TTL != tc.ttl.Truncate(time.Second) {
			t.Fatalf("TTL %v comes back as %v, %v", tc.ttl, back.TTL, err)
		}
	}
}

func TestSignRequestRefusesTTLsTheWireCannotCarry(t *testing.T) {
	for _, ttl := range []time.Duration{-time.Second, 500 * time.Millisecond} {
		if _, err := NewMsg("s", "test", SignRequest{CSR: testCSR, Token: "t", TTL: ttl}); err == nil || !strings.Contains(err.Error(), "ttl_seconds") {
			t.Fatalf("encode TTL %v: %v, want an error naming ttl_seconds", ttl, err)
		}
	}
}

// TestTheSubjectDecidesTheEncoding: a sign request is built compact on a sign
// subject and as a CloudEvent elsewhere; any other payload is always a CloudEvent;
// DecodeReply reads a sign reply in either form.
func TestTheSubjectDecidesTheEncoding(t *testing.T) {
	req := SignRequest{CSR: "-----BEGIN CERTIFICATE REQUEST-----\nMA==\n-----END CERTIFICATE REQUEST-----\n", Token: "t"}
	for _, tc := range []struct {
		subject string
		p       Payload
		compact bool
	}{
		{SubjectSignAny, req, true},
		{Prefix + ".rpc.sign.id.shop.web.web-0", req, true},
		{SubjectTrustBundle, BundleRequest{}, false},
		{Prefix + ".rpc.signer", req, false},
	} {
		m, err := NewMsgOn(tc.subject, "test", tc.p)
		if err != nil {
			t.Fatalf("%s: %v", tc.subject, err)
		}
		if IsCompact(m) != tc.compact {
			t.Errorf("%s: compact %t, want %t", tc.subject, IsCompact(m), tc.compact)
		}
	}
	for _, enc := range []Encoding{EncodingCompact, EncodingJSON} {
		m, err := NewSignReplyMsg("_INBOX.x", enc, "signer", SignReply{Error: &ReplyError{Code: CodeUnavailable, Message: "m"}})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := DecodeReply[SignReply](m)
		if err != nil || rep.Error == nil || rep.Error.Code != CodeUnavailable {
			t.Fatalf("%s: %+v, %v", enc, rep, err)
		}
	}
}

// TestRetryAfterTravelsAndIsBounded: a busy refusal's retry-after arrives in both
// encodings, and a reply that asks for a wait beyond MaxRetryAfter is refused by
// the sender and by the decoder (a garbled or hostile reply cannot park a pod).
func TestRetryAfterTravelsAndIsBounded(t *testing.T) {
	for _, enc := range []Encoding{EncodingCompact, EncodingJSON} {
		m, err := NewSignReplyMsg("_INBOX.x", enc, "signer", SignReply{Error: &ReplyError{Code: CodeUnavailable, Message: "busy", RetryAfterMillis: 1500}})
		if err != nil {
			t.Fatal(err)
		}
		rep, _, err := DecodeSignReply(m)
		if err != nil || RetryAfterOf(rep.Error) != 1500*time.Millisecond {
			t.Fatalf("%s: %+v, %v: want a retry-after of 1.5s", enc, rep.Error, err)
		}
		over := uint64(MaxRetryAfter/time.Millisecond) + 1
		if _, err := NewSignReplyMsg("_INBOX.x", enc, "signer", SignReply{Error: &ReplyError{Code: CodeUnavailable, Message: "busy", RetryAfterMillis: over}}); err == nil {
			t.Fatalf("%s: a retry-after of %d ms was sent", enc, over)
		}
	}
	// A compact reply carrying too long a wait, built by hand as a hostile signer would.
	e := appendVarint(appendString(appendString(nil, 1, CodeUnavailable), 2, "busy"), 3, uint64(MaxRetryAfter/time.Millisecond)+1)
	m, err := newCompactMsg("_INBOX.x", appendBytes([]byte(compactPrefix(TypeSignReply)), 6, e))
	if err != nil {
		t.Fatal(err)
	}
	if rep, _, err := DecodeSignReply(m); err == nil {
		t.Fatalf("decoded %+v: want the too-long retry-after refused", rep.Error)
	}
	if RetryAfterOf(errors.New("no reply error")) != 0 {
		t.Fatal("retry-after of a plain error")
	}
}

// TestSignRequestDeadlinePeek: the intake's peek reads the deadline a full decode
// reads, and nothing from a request without one or from a JSON one.
func TestSignRequestDeadlinePeek(t *testing.T) {
	at := time.UnixMilli(1_796_700_000_123).UTC()
	for _, tc := range []struct {
		name string
		enc  Encoding
		req  SignRequest
		ok   bool
	}{
		{"compact with a deadline", EncodingCompact, SignRequest{CSR: pemOf("CERTIFICATE REQUEST", 0x30, 1, 2, 3), Token: "t", Deadline: at}, true},
		{"compact without", EncodingCompact, SignRequest{CSR: pemOf("CERTIFICATE REQUEST", 0x30, 1, 2, 3), Token: "t"}, false},
		{"json with a deadline", EncodingJSON, SignRequest{CSR: pemOf("CERTIFICATE REQUEST", 0x30, 1, 2, 3), Token: "t", Deadline: at}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewSignRequestMsg(SubjectSignAny, tc.enc, "test", tc.req)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := SignRequestDeadline(m)
			if ok != tc.ok || ok && !got.Equal(at) {
				t.Fatalf("peek %s, %t; want %s, %t", got, ok, at, tc.ok)
			}
			if full, _, err := DecodeSignRequest(m); err != nil || ok && !full.Deadline.Equal(got) {
				t.Fatalf("full decode %s, %v; the peek said %s", full.Deadline, err, got)
			}
		})
	}
	if _, ok := SignRequestDeadline(&nats.Msg{Data: []byte("\x00io.meshagent.sign.request.v1\x00\x50")}); ok {
		t.Fatal("a truncated request peeked")
	}
}

// TestSignRequestExpired: a request without a deadline never expires; one with a
// deadline has expired from that instant on.
func TestSignRequestExpired(t *testing.T) {
	at := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	r := SignRequest{}
	if r.Expired(at.Add(100 * 365 * 24 * time.Hour)) {
		t.Fatal("a request without a deadline expired")
	}
	r.Deadline = at
	if r.Expired(at.Add(-time.Millisecond)) || !r.Expired(at) || !r.Expired(at.Add(time.Second)) {
		t.Fatalf("deadline %s: expired before it, or not at or after it", at)
	}
}
