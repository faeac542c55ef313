package events

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// NewSignRequestMsg builds a sign request on subject in encoding enc (compact.go);
// source names the sender in a JSON request's envelope. req is validated first.
func NewSignRequestMsg(subject string, enc Encoding, source string, req SignRequest) (*nats.Msg, error) {
	if enc == EncodingJSON {
		return NewMsg(subject, source, req)
	}
	if err := req.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, TypeSignRequest, err)
	}
	blk, rest := pem.Decode([]byte(req.CSR))
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: %s: csr: not one PEM certificate request", ErrInvalid, TypeSignRequest)
	}
	b := make([]byte, 0, 64+len(blk.Bytes)+len(req.Token)+len(req.Pod.Name)+len(req.Pod.Namespace)+1+len(req.Proof))
	b = append(b, compactPrefix(TypeSignRequest)...)
	b = appendBytes(b, 1, blk.Bytes)
	b = appendString(b, 2, req.Token)
	b, err := appendPEMs(b, 3, req.CertChain, "cert_chain")
	if err != nil {
		return nil, err
	}
	b = appendString(b, 4, req.Proof)
	b = appendVarint(b, 5, uint64(req.TTL.Seconds()))
	b = appendString(b, 6, req.Pod.String())
	b = appendString(b, 7, req.Resource)
	b = appendString(b, 8, req.KeyAlgorithm)
	b = appendString(b, 9, req.CertSigner)
	if !req.Deadline.IsZero() && req.Deadline.UnixMilli() > 0 {
		b = appendVarint(b, 10, uint64(req.Deadline.UnixMilli()))
	}
	return newCompactMsg(subject, b)
}

// DecodeSignRequest decodes a sign request in either encoding and says which it
// was: a signer answers in the same one. Like Decode, it rejects oversized bodies,
// unknown and wrong types, and invalid payloads.
func DecodeSignRequest(msg *nats.Msg) (SignRequest, Encoding, error) {
	return decodeEither(msg, func(r *fieldReader, req *SignRequest, f field) {
		switch f.num {
		case 1:
			if r.once(f, wireBytes) {
				if len(f.bytes) == 0 {
					r.fail(f, "empty csr")
					return
				}
				req.CSR = pemString("CERTIFICATE REQUEST", f.bytes)
			}
		case 2:
			r.str(f, &req.Token)
		case 3:
			r.der(f, "CERTIFICATE", &req.CertChain)
		case 4:
			r.str(f, &req.Proof)
		case 5:
			if r.once(f, wireVarint) {
				if f.u > uint64(MaxTTLSeconds) {
					r.fail(f, "ttl_seconds: %d seconds is more than a TTL can be (%d)", f.u, MaxTTLSeconds)
					return
				}
				req.TTL, _ = TTLFromSeconds(int64(f.u))
			}
		case 6:
			var s string
			r.str(f, &s)
			_ = req.Pod.UnmarshalText([]byte(s)) // never fails; Validate checks it
		case 7:
			r.str(f, &req.Resource)
		case 8:
			r.str(f, &req.KeyAlgorithm)
		case 9:
			r.str(f, &req.CertSigner)
		case 10:
			if r.once(f, wireVarint) {
				if f.u == 0 || f.u > maxDeadlineMilli {
					r.fail(f, "deadline_unix_ms: %d is no time a request waits until", f.u)
					return
				}
				req.Deadline = time.UnixMilli(int64(f.u)).UTC()
			}
		}
	})
}

// maxDeadlineMilli bounds a sign request's deadline on the wire (the year 9999):
// larger values would overflow a time.Time's arithmetic.
const maxDeadlineMilli = 253402300799999

// decodeEither decodes msg as a T: a CloudEvent (Decode), or a compact body whose
// fields read fills in, then validated as Decode validates.
func decodeEither[T Payload](msg *nats.Msg, read func(r *fieldReader, p *T, f field)) (T, Encoding, error) {
	var p T
	if !IsCompact(msg) {
		p, _, err := Decode[T](msg)
		return p, EncodingJSON, err
	}
	body, err := compactBody(msg.Data, p.EventType())
	if err != nil {
		return p, EncodingCompact, err
	}
	var r fieldReader
	r.each(body, func(f field) { read(&r, &p, f) })
	if r.err == nil {
		r.err = p.Validate()
	}
	if r.err != nil {
		var zero T
		return zero, EncodingCompact, fmt.Errorf("%w: %s (compact): %w", ErrInvalid, p.EventType(), r.err)
	}
	return p, EncodingCompact, nil
}

// NewSignReplyMsg builds a sign reply on subject in encoding enc; source names
// the signer in a JSON reply's envelope. rep is validated first.
func NewSignReplyMsg(subject string, enc Encoding, source string, rep SignReply) (*nats.Msg, error) {
	if enc == EncodingJSON {
		return NewMsg(subject, source, rep)
	}
	if err := rep.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, TypeSignReply, err)
	}
	b := []byte(compactPrefix(TypeSignReply))
	if rep.Error != nil {
		var e []byte
		e = appendString(e, 1, rep.Error.Code)
		e = appendString(e, 2, rep.Error.Message)
		if rep.Error.RetryAfterMillis > 0 {
			e = appendVarint(e, 3, rep.Error.RetryAfterMillis)
		}
		return newCompactMsg(subject, appendBytes(b, 6, e))
	}
	b, err := appendPEMs(b, 1, rep.CertChain, "cert_chain")
	if err != nil {
		return nil, err
	}
	tail, err := signReplyTail(nil, rep.Roots, rep.TrustDomain, rep.Generation, rep.Endorsements, rep.Signer)
	if err != nil {
		return nil, err
	}
	return newCompactMsg(subject, append(b, tail...))
}

// SignReplyTail is the end of a compact sign reply: everything after the leaf (the
// chain above it, the trust bundle, its generation and endorsements), the same for
// every leaf a signer signs with one CA material. A signer encodes and checks it
// once per material (NewSignReplyTail) and sends each leaf with it (NewCompactSignReply).
type SignReplyTail struct{ b []byte }

// NewSignReplyTail encodes the chain above a leaf (signing certificate first, root
// last), the bundle and, for a named signer's chain, its endorsed roots (nil: none).
// It holds what SignReply.Validate asks of a reply with its leaf: at least one
// certificate above the leaf and one root, all PEM certificates.
func NewSignReplyTail(chain, roots []string, trustDomain string, generation uint64, endorsements []Endorsement, signer *SignerRoots) (SignReplyTail, error) {
	if len(chain) == 0 || len(roots) == 0 {
		return SignReplyTail{}, fmt.Errorf("%w: %s: need a certificate above the leaf and a root, have %d and %d", ErrInvalid, TypeSignReply, len(chain), len(roots))
	}
	if signer != nil {
		if err := signer.Validate(); err != nil {
			return SignReplyTail{}, fmt.Errorf("%w: %s: %w", ErrInvalid, TypeSignReply, err)
		}
	}
	b, err := signReplyTail(chain, roots, trustDomain, generation, endorsements, signer)
	if err != nil {
		return SignReplyTail{}, err
	}
	return SignReplyTail{b: b}, nil
}

func signReplyTail(chain, roots []string, trustDomain string, generation uint64, endorsements []Endorsement, signer *SignerRoots) ([]byte, error) {
	b, err := appendPEMs(nil, 1, chain, "cert_chain")
	if err != nil {
		return nil, err
	}
	if b, err = appendPEMs(b, 2, roots, "roots"); err != nil {
		return nil, err
	}
	b = appendString(b, 3, trustDomain)
	b = appendVarint(b, 4, generation)
	if b, err = appendEndorsements(b, 5, endorsements, "endorsements"); err != nil {
		return nil, err
	}
	if signer != nil {
		s := appendString(nil, 1, signer.Name)
		if s, err = appendPEMs(s, 2, signer.Roots, "signer.roots"); err != nil {
			return nil, err
		}
		if s, err = appendEndorsements(s, 3, signer.Endorsements, "signer.endorsements"); err != nil {
			return nil, err
		}
		b = appendBytes(b, 7, s)
	}
	return b, nil
}

// appendEndorsements appends each endorsement as field num.
func appendEndorsements(b []byte, num uint64, endorsements []Endorsement, name string) ([]byte, error) {
	var err error
	for i, e := range endorsements {
		m := appendString(nil, 1, e.KeyID)
		m = appendString(m, 2, e.Signature)
		if m, err = appendPEMs(m, 3, e.Chain, fmt.Sprintf("%s[%d].chain", name, i)); err != nil {
			return nil, err
		}
		b = appendBytes(b, num, m)
	}
	return b, nil
}

// readEndorsement reads one endorsement of field f into *out.
func readEndorsement(r *fieldReader, f field, out *[]Endorsement) {
	if !r.is(f, wireBytes) {
		return
	}
	var e Endorsement
	if err := r.sub(f, "endorsement", func(er *fieldReader, g field) {
		switch g.num {
		case 1:
			er.str(g, &e.KeyID)
		case 2:
			er.str(g, &e.Signature)
		case 3:
			er.der(g, "CERTIFICATE", &e.Chain)
		}
	}); err == nil {
		*out = append(*out, e)
	}
}

// NewCompactSignReply is a compact sign reply on subject: the leaf's DER, then tail.
func NewCompactSignReply(subject string, leafDER []byte, tail SignReplyTail) (*nats.Msg, error) {
	prefix := compactPrefix(TypeSignReply)
	b := make([]byte, 0, len(prefix)+8+len(leafDER)+len(tail.b))
	b = append(b, prefix...)
	b = appendBytes(b, 1, leafDER)
	return newCompactMsg(subject, append(b, tail.b...))
}

// DecodeSignReply decodes a sign reply in either encoding and says which it was.
// Like Decode, it rejects oversized bodies, unknown and wrong types, and invalid
// payloads.
func DecodeSignReply(msg *nats.Msg) (SignReply, Encoding, error) {
	return decodeEither(msg, func(r *fieldReader, rep *SignReply, f field) {
		switch f.num {
		case 1:
			r.der(f, "CERTIFICATE", &rep.CertChain)
		case 2:
			r.der(f, "CERTIFICATE", &rep.Roots)
		case 3:
			r.str(f, &rep.TrustDomain)
		case 4:
			if r.once(f, wireVarint) {
				rep.Generation = f.u
			}
		case 5:
			readEndorsement(r, f, &rep.Endorsements)
		case 7:
			if r.once(f, wireBytes) {
				s := &SignerRoots{}
				if err := r.sub(f, "signer", func(sr *fieldReader, g field) {
					switch g.num {
					case 1:
						sr.str(g, &s.Name)
					case 2:
						sr.der(g, "CERTIFICATE", &s.Roots)
					case 3:
						readEndorsement(sr, g, &s.Endorsements)
					}
				}); err == nil {
					rep.Signer = s
				}
			}
		case 6:
			if r.once(f, wireBytes) {
				e := &ReplyError{}
				if err := r.sub(f, "error", func(er *fieldReader, g field) {
					switch g.num {
					case 1:
						er.str(g, &e.Code)
					case 2:
						er.str(g, &e.Message)
					case 3:
						if er.once(g, wireVarint) {
							if g.u > uint64(MaxRetryAfter/time.Millisecond) {
								er.fail(g, "retry_after_ms: %d ms is more than %s", g.u, MaxRetryAfter)
								return
							}
							e.RetryAfterMillis = g.u
						}
					}
				}); err == nil {
					rep.Error = e
				}
			}
		}
	})
}

// IsSignSubject reports whether subject is a sign subject (meshagent.rpc.sign.>)
// or one sent to a replica by name (ReplicaSignSubject), whose one encoding is the
// compact form: a signer refuses a CloudEvent there.
func IsSignSubject(subject string) bool {
	if _, _, ok := SignSubjectOfReplica(subject); ok {
		return true
	}
	return strings.HasPrefix(subject, SignWildcard[:len(SignWildcard)-1])
}

// NewMsgOn builds p as subject carries it: a sign request in the compact form on
// a sign subject, anything else as a CloudEvent (NewMsg). Tools and tests that send
// every kind of request through one helper use it, so that none of them picks an
// encoding the subject does not take.
func NewMsgOn(subject, source string, p Payload) (*nats.Msg, error) {
	if req, ok := p.(SignRequest); ok && IsSignSubject(subject) {
		return NewSignRequestMsg(subject, EncodingCompact, source, req)
	}
	return NewMsg(subject, source, p)
}

// DecodeReply decodes a reply as T in whichever form it came: a sign reply may be
// compact (DecodeSignReply), every other payload is a CloudEvent (Decode).
func DecodeReply[T Payload](msg *nats.Msg) (T, error) {
	var zero T
	if _, ok := any(zero).(SignReply); ok {
		rep, _, err := DecodeSignReply(msg)
		return any(rep).(T), err
	}
	v, _, err := Decode[T](msg)
	return v, err
}

// SignRequestDeadline reads only the deadline of a compact sign request (field
// 10), for a signer's intake deciding whether the request can wait in its queue:
// no CSR is copied, nothing validated. ok is false for anything else — no
// deadline, not compact, malformed — which the full decode then judges.
func SignRequestDeadline(msg *nats.Msg) (deadline time.Time, ok bool) {
	if !IsCompact(msg) {
		return time.Time{}, false
	}
	b, err := compactBody(msg.Data, TypeSignRequest)
	if err != nil {
		return time.Time{}, false
	}
	for len(b) > 0 {
		var f field
		if f, b, err = nextField(b); err != nil {
			return time.Time{}, false
		}
		if f.num == 10 && f.wire == wireVarint && f.u > 0 && f.u <= maxDeadlineMilli {
			return time.UnixMilli(int64(f.u)).UTC(), true
		}
	}
	return time.Time{}, false
}
