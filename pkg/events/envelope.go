package events

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats.go"
)

// CloudEvents attribute headers (NATS binding, binary content mode).
const (
	SpecVersion = "1.0"

	HeaderSpecVersion = "ce-specversion"
	HeaderID          = "ce-id"
	HeaderSource      = "ce-source"
	HeaderType        = "ce-type"
	HeaderTime        = "ce-time"
	HeaderSubject     = "ce-subject"
	HeaderContentType = "content-type"

	ContentTypeJSON = "application/json"
)

// MaxEventSize bounds the body of every event, request and reply.
const MaxEventSize = 64 << 10

// Decode errors. Match them with errors.Is.
var (
	ErrTooLarge    = errors.New("event too large")
	ErrNotEvent    = errors.New("not a cloudevent")
	ErrUnknownType = errors.New("unknown event type")
	ErrWrongType   = errors.New("unexpected event type")
	ErrInvalid     = errors.New("invalid event payload")
)

// Payload is implemented by every event body.
type Payload interface {
	// EventType is the versioned CloudEvents type, e.g. io.meshagent.cert.issued.v1.
	EventType() string
	// Validate reports missing or malformed fields.
	Validate() error
}

// Meta holds the CloudEvents context attributes of one event.
type Meta struct {
	ID      string
	Source  string
	Type    string
	Subject string // the CloudEvents subject attribute, e.g. a pod or a serial
	Time    time.Time
}

// NewMsg builds a NATS message carrying p as a CloudEvent from source, with a fresh
// id and the wall clock's time. A caller with a clock of its own stamps the event
// with it: Encode with Meta.Time.
func NewMsg(subject, source string, p Payload) (*nats.Msg, error) {
	return Encode(subject, Meta{Source: source}, p)
}

// Encode builds a NATS message carrying p. An empty ID in meta is filled in, and a
// zero Time with the wall clock's (clock.Real).
// p is validated first: an invalid payload is never published.
func Encode(subject string, meta Meta, p Payload) (*nats.Msg, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, p.EventType(), err)
	}
	if meta.Source == "" {
		return nil, fmt.Errorf("%w: empty source", ErrInvalid)
	}
	body, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", p.EventType(), err)
	}
	if len(body) > MaxEventSize {
		return nil, fmt.Errorf("%w: %s is %d bytes, limit %d", ErrTooLarge, p.EventType(), len(body), MaxEventSize)
	}
	if meta.ID == "" {
		meta.ID = NewID()
	}
	if meta.Time.IsZero() {
		meta.Time = clock.Real{}.Now()
	}
	m := nats.NewMsg(subject)
	m.Header.Set(HeaderSpecVersion, SpecVersion)
	m.Header.Set(HeaderID, meta.ID)
	m.Header.Set(HeaderSource, meta.Source)
	m.Header.Set(HeaderType, p.EventType())
	m.Header.Set(HeaderTime, meta.Time.UTC().Format(time.RFC3339Nano))
	if meta.Subject != "" {
		m.Header.Set(HeaderSubject, meta.Subject)
	}
	m.Header.Set(HeaderContentType, ContentTypeJSON)
	m.Data = body
	return m, nil
}

// NewID returns a random 128-bit event id in hex.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Peek reads and checks the envelope of msg without decoding the payload. It rejects
// oversized bodies, missing attributes and types this package does not know.
func Peek(msg *nats.Msg) (Meta, error) {
	if msg == nil {
		return Meta{}, ErrNotEvent
	}
	if len(msg.Data) > MaxEventSize {
		return Meta{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(msg.Data), MaxEventSize)
	}
	h := msg.Header
	if h == nil || h.Get(HeaderSpecVersion) != SpecVersion {
		return Meta{}, fmt.Errorf("%w: missing or unsupported %s", ErrNotEvent, HeaderSpecVersion)
	}
	meta := Meta{
		ID:      h.Get(HeaderID),
		Source:  h.Get(HeaderSource),
		Type:    h.Get(HeaderType),
		Subject: h.Get(HeaderSubject),
	}
	if meta.ID == "" || meta.Source == "" || meta.Type == "" {
		return Meta{}, fmt.Errorf("%w: missing id, source or type", ErrNotEvent)
	}
	if ct := h.Get(HeaderContentType); ct != "" && ct != ContentTypeJSON {
		return Meta{}, fmt.Errorf("%w: content-type %q", ErrNotEvent, ct)
	}
	if ts := h.Get(HeaderTime); ts != "" {
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return Meta{}, fmt.Errorf("%w: bad %s: %w", ErrNotEvent, HeaderTime, err)
		}
		// Encode writes times in UTC: refuse one whose UTC year has no four digits
		// (0000-01-01T00:00:00+01:00), which could not be written back.
		if y := t.UTC().Year(); y < 0 || y > 9999 {
			return Meta{}, fmt.Errorf("%w: bad %s: %q is outside years 0000-9999 in UTC", ErrNotEvent, HeaderTime, ts)
		}
		meta.Time = t
	}
	if _, ok := registry[meta.Type]; !ok {
		return Meta{}, fmt.Errorf("%w: %q", ErrUnknownType, meta.Type)
	}
	return meta, nil
}

// Decode checks the envelope of msg, requires its type to be T's, and decodes and
// validates the payload. Unknown JSON fields are ignored; anything else malformed is
// an error wrapping ErrTooLarge, ErrNotEvent, ErrUnknownType, ErrWrongType or ErrInvalid.
func Decode[T Payload](msg *nats.Msg) (T, Meta, error) {
	var zero T
	meta, err := Peek(msg)
	if err != nil {
		return zero, meta, err
	}
	if meta.Type != zero.EventType() {
		return zero, meta, fmt.Errorf("%w: got %q, want %q", ErrWrongType, meta.Type, zero.EventType())
	}
	p, err := decodeBody[T](msg.Data)
	return p, meta, err
}

func decodeBody[T Payload](data []byte) (T, error) {
	var p T
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return p, fmt.Errorf("%w: %s: body is not a JSON object", ErrInvalid, p.EventType())
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("%w: %s: %w", ErrInvalid, p.EventType(), err)
	}
	if dec.More() {
		return p, fmt.Errorf("%w: %s: trailing data after JSON object", ErrInvalid, p.EventType())
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("%w: %s: %w", ErrInvalid, p.EventType(), err)
	}
	return p, nil
}

// DecodeAny decodes any known event into its payload type, for generic subscribers
// such as audit logs.
func DecodeAny(msg *nats.Msg) (Payload, Meta, error) {
	meta, err := Peek(msg)
	if err != nil {
		return nil, meta, err
	}
	p, err := registry[meta.Type](msg.Data)
	return p, meta, err
}

// KnownTypes lists every event type this package can decode.
func KnownTypes() []string {
	out := make([]string, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	return out
}

// registry maps each type name to a decoder of its body.
var registry = map[string]func([]byte) (Payload, error){}

func register[T Payload]() {
	var zero T
	registry[zero.EventType()] = func(b []byte) (Payload, error) { return decodeBody[T](b) }
}
