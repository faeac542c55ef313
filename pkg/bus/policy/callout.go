package policy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// AuthTimeout is how long nats-server waits for a connecting client's credential
// and for the auth callout's answer (the rendered configuration's authorization
// timeout). It must stay below the clients' connect timeout (bus.ConnectTimeout):
// a client that gives up first leaves the callout admitting connections no one
// uses, and reconnecting to be admitted again — an overload that feeds itself.
// And it must stay within the server's first ping to a new client (2 to 2.4 s
// after its CONNECT): a client still waiting for its PONG when that PING comes
// fails its connect ("expected PONG, got PING", nats.go) although the callout
// admitted it — measured as most of the wasted admissions of a storm.
const AuthTimeout = 2 * time.Second

// DecodeAuthRequest decodes the connect request nats-server sends to the auth
// callout: a JWT of an authorization request, issued by the server that names
// itself in it, for a user nkey.
//
// The request's signature is not checked. nats-server signs it with a key it makes
// when it starts and names in the request itself, so the check would prove only
// that the request agrees with itself: whoever could publish on the callout
// subject could sign one as well. What makes a request the server's is that no one
// else may publish there (the callout's account holds only the callout user, which
// may only subscribe: For(Callout)); what the callout acts on in it — the
// client's token or certificate — it verifies itself. The check was 85 % of a
// decode (BenchmarkDecodeAuthRequest: 78 against 15 µs), paid in every admission
// and every refusal, busy ones included.
func DecodeAuthRequest(data []byte) (*jwt.AuthorizationRequestClaims, error) {
	req, err := decodeAuthRequest(data)
	if err != nil {
		return nil, fmt.Errorf("decode auth request: %w", err)
	}
	return req, nil
}

func decodeAuthRequest(data []byte) (*jwt.AuthorizationRequestClaims, error) {
	if len(data) > jwt.MaxTokenSize {
		return nil, fmt.Errorf("%d bytes, more than a JWT's %d", len(data), jwt.MaxTokenSize)
	}
	chunks := bytes.Split(data, []byte("."))
	if len(chunks) != 3 {
		return nil, errors.New("not a JWT: expected 3 chunks")
	}
	var header jwt.Header
	if err := decodeJWTPart(chunks[0], &header); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if !strings.EqualFold(header.Type, jwt.TokenTypeJwt) || (header.Algorithm != jwt.AlgorithmNkey && header.Algorithm != jwt.AlgorithmNkeyOld) {
		return nil, fmt.Errorf("header: type %q algorithm %q, not a NATS JWT", header.Type, header.Algorithm)
	}
	var req jwt.AuthorizationRequestClaims
	if err := decodeJWTPart(chunks[1], &req); err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	if req.Type != jwt.AuthorizationRequestClaim {
		return nil, fmt.Errorf("a %q claim, not an authorization request", req.Type)
	}
	if !nkeys.IsValidPublicServerKey(req.Issuer) || req.Server.ID != req.Issuer {
		return nil, fmt.Errorf("issued by %q for server %q: not a server's request", req.Issuer, req.Server.ID)
	}
	if !nkeys.IsValidPublicUserKey(req.UserNkey) {
		return nil, errors.New("no user nkey")
	}
	return &req, nil
}

// decodeJWTPart decodes one base64url part of a JWT into v.
func decodeJWTPart(part []byte, v any) error {
	raw := make([]byte, base64.RawURLEncoding.DecodedLen(len(part)))
	n, err := base64.RawURLEncoding.Decode(raw, part)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw[:n], v)
}

// AdmitPod answers req with a user in AccountMesh holding ForPod(pod)'s permissions
// and expiring at expires (the credential's own expiry: the server disconnects the
// client then, and it reconnects with a fresh credential).
func AdmitPod(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, pod events.PodRef, expires time.Time) ([]byte, error) {
	p, err := ForPod(pod)
	if err != nil {
		return nil, err
	}
	return admit(issuer, req, pod, p, expires)
}

// AdmitPodIdentity is AdmitPod for a pod whose token proved its namespace (the
// pod's) and service account sa: it may also publish on its identity sign subject
// (events.IdentitySignSubject), where a signer run with -bus-sign-id takes the
// identity from the subject instead of verifying a token per request. A name that
// cannot be one subject token is an error (refuse the connection), never escaped.
func AdmitPodIdentity(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, pod events.PodRef, sa string, expires time.Time) ([]byte, error) {
	p, err := ForPodIdentity(pod, sa)
	if err != nil {
		return nil, err
	}
	return admit(issuer, req, pod, p, expires)
}

func admit(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, pod events.PodRef, p Permissions, expires time.Time) ([]byte, error) {
	return admitWith(issuer, req, pod, p, expires, nil)
}

// admitWith is admit with more claims set by limit (PodLimits.apply) when not nil.
func admitWith(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, pod events.PodRef, p Permissions, expires time.Time, limit func(*jwt.UserClaims)) ([]byte, error) {
	out, err := admitUser(issuer, req, "pod/"+pod.String(), p, expires, limit)
	if err != nil {
		return nil, fmt.Errorf("admit pod %s: %w", pod, err)
	}
	return out, nil
}

// admitUser answers req with a user named name in AccountMesh holding p until
// expires, with more claims set by limit when not nil. A credential that expires
// before the server asked (req's issue time, on the server's clock, which is the
// one that judges the user's expiry) is refused.
func admitUser(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, name string, p Permissions, expires time.Time, limit func(*jwt.UserClaims)) ([]byte, error) {
	if expires.Unix() <= req.IssuedAt {
		return nil, fmt.Errorf("credential already expired at %s", expires.UTC().Format(time.RFC3339))
	}
	uc := jwt.NewUserClaims(req.UserNkey)
	uc.Name = name
	uc.Audience = AccountMesh // server-config mode: the audience is the account
	uc.Expires = expires.Unix()
	uc.Pub.Allow.Add(p.Publish...)
	uc.Sub.Allow.Add(p.Subscribe...)
	if limit != nil {
		limit(uc)
	}
	ujwt, err := uc.Encode(issuer)
	if err != nil {
		return nil, fmt.Errorf("sign user %s: %w", name, err)
	}
	return respond(issuer, req, ujwt, "")
}

// Refuse answers req with a refusal; nats-server closes the connection with an
// authorization violation (reason is logged by the server, not told to the client).
func Refuse(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, reason string) ([]byte, error) {
	if reason == "" {
		reason = "not authorized"
	}
	return respond(issuer, req, "", reason)
}

func respond(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, ujwt, reason string) ([]byte, error) {
	rc := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	rc.Audience = req.Server.ID
	rc.Jwt = ujwt
	rc.Error = reason
	tok, err := rc.Encode(issuer)
	if err != nil {
		return nil, fmt.Errorf("sign auth response: %w", err)
	}
	return []byte(tok), nil
}
