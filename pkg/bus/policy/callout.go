package policy

import (
	"errors"
	"fmt"
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

// DecodeAuthRequest decodes the connect request nats-server sends to the auth callout
// (a JWT signed by the server's own key).
func DecodeAuthRequest(data []byte) (*jwt.AuthorizationRequestClaims, error) {
	req, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, fmt.Errorf("decode auth request: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(req.UserNkey) || req.Server.ID == "" {
		return nil, errors.New("decode auth request: no user nkey or server id")
	}
	return req, nil
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
	if !expires.After(time.Now()) {
		return nil, fmt.Errorf("admit pod %s: credential already expired at %s", pod, expires.UTC().Format(time.RFC3339))
	}
	uc := jwt.NewUserClaims(req.UserNkey)
	uc.Name = "pod/" + pod.String()
	uc.Audience = AccountMesh // server-config mode: the audience is the account
	uc.Expires = expires.Unix()
	uc.Pub.Allow.Add(p.Publish...)
	uc.Sub.Allow.Add(p.Subscribe...)
	if limit != nil {
		limit(uc)
	}
	ujwt, err := uc.Encode(issuer)
	if err != nil {
		return nil, fmt.Errorf("sign pod user: %w", err)
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
