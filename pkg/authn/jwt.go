// Package authn authenticates a workload by its credential: JWT bearer tokens
// (Kubernetes service-account tokens or meshctl's dev tokens) verified offline
// against a JWKS (a file, a URL, or the one the issuer's OIDC discovery document
// names) or by the API server's TokenReview, and client certificates that chain to
// given roots. It returns the caller's SPIFFE ID, and the pod and node a bound
// token names; the CSR never has a say in it. The signer authenticates sign
// requests and bus connections with it, the node agent its node's pods.
package authn

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// ErrUnauthenticated wraps every authentication failure.
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrUnavailable wraps a credential that could not be checked (the API server's
// TokenReview did not answer): no verdict on the credential, the caller retries.
var ErrUnavailable = errors.New("token verification unavailable")

// Sources of identity, as cert.issued names them.
const (
	SourceJWT  = "jwt"
	SourceX509 = "x509"
)

// Caller is an authenticated caller.
type Caller struct {
	ID     *url.URL // spiffe://<td>/ns/<ns>/sa/<sa>
	Source string   // SourceJWT or SourceX509
	// Pod is the pod the credential was issued for: the kubernetes.io.pod.name claim
	// of a pod-bound token, in the token's namespace (a pod is namespace + name: the
	// same name in another namespace is another pod). Zero when the credential names
	// no pod (tokens without the claim, client certificates).
	Pod events.PodRef
	// Node is the kubernetes.io.node.name claim of a pod-bound token: the node the
	// pod is scheduled on. "" when the token names none.
	Node string
	// PodUID is the kubernetes.io.pod.uid claim, when the token has one: it tells a
	// recreated pod of the same name from the one before.
	PodUID string
	// Expires is when the credential stops being valid (a token's exp); zero when
	// the credential has no expiry of its own to report.
	Expires time.Time
	// Issued is when the credential was issued (a token's iat, a certificate's
	// notBefore); zero when unknown.
	Issued time.Time
}

func fail(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUnauthenticated, fmt.Sprintf(format, a...))
}

// tokenAlgs are the signature algorithms accepted in tokens; "none" and HMAC never are.
var tokenAlgs = []jose.SignatureAlgorithm{
	jose.ES256, jose.ES384, jose.ES512, jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512, jose.EdDSA,
}

// claims are the registered claims plus Kubernetes' service-account claims, decoded
// in one pass.
type claims struct {
	jwt.Claims
	Kubernetes *struct {
		Namespace      string `json:"namespace"`
		ServiceAccount struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"serviceaccount"`
		Pod *struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
		Node *struct {
			Name string `json:"name"`
		} `json:"node"`
	} `json:"kubernetes.io"`
}

// JWTVerifier checks bearer tokens offline.
type JWTVerifier struct {
	Keys        *KeySet
	Issuer      string
	Audience    string
	TrustDomain string
	Leeway      time.Duration
	Clock       clock.Clock // nil: the wall clock
}

// Ready is nil once the verifier holds keys to check tokens against.
func (v *JWTVerifier) Ready() error {
	if v == nil || v.Keys == nil {
		return errors.New("no JWKS configured")
	}
	if len(v.Keys.Current().Keys) == 0 {
		return errors.New("token signing keys (JWKS) not loaded yet")
	}
	return nil
}

// Verify checks the token's signature (by kid against the JWKS), issuer, audience and
// times, and returns the workload identity from its "kubernetes.io" claims, falling
// back to sub = system:serviceaccount:<ns>:<sa>, and the pod of a pod-bound token
// (kubernetes.io.pod.name).
func (v *JWTVerifier) Verify(token string) (Caller, error) {
	if v == nil || v.Keys == nil {
		return Caller{}, fail("bearer tokens are not accepted: no JWKS configured")
	}
	c, err := v.verifiedClaims(token)
	if err != nil {
		return Caller{}, err
	}
	if err := v.validTimes(c.Claims); err != nil {
		return Caller{}, err
	}
	return v.callerOf(c)
}

// verifiedClaims parses token and verifies its one signature by a key of the
// JWKS: the one its kid names, else any.
func (v *JWTVerifier) verifiedClaims(token string) (claims, error) {
	tok, err := jwt.ParseSigned(token, tokenAlgs)
	if err != nil {
		return claims{}, fail("malformed token: %v", err)
	}
	if len(tok.Headers) != 1 {
		return claims{}, fail("token must have exactly one signature")
	}
	var candidates []jose.JSONWebKey
	if kid := tok.Headers[0].KeyID; kid != "" {
		candidates = v.Keys.Lookup(kid)
		if len(candidates) == 0 {
			return claims{}, fail("token signed by unknown key id %q", kid)
		}
	} else {
		candidates = v.Keys.Current().Keys
	}
	var c claims
	for _, k := range candidates {
		if k.Use == "enc" {
			continue
		}
		if err := tok.Claims(k.Public(), &c); err == nil {
			return c, nil
		}
	}
	return claims{}, fail("token signature does not verify")
}

// validTimes checks the token's issuer, audience and times, now on v's clock.
func (v *JWTVerifier) validTimes(std jwt.Claims) error {
	if std.Expiry == nil {
		return fail("token has no exp claim")
	}
	var clk clock.Clock = clock.Real{}
	if v.Clock != nil {
		clk = v.Clock
	}
	exp := jwt.Expected{Issuer: v.Issuer, AnyAudience: jwt.Audience{v.Audience}, Time: clk.Now()}
	if err := std.ValidateWithLeeway(exp, v.Leeway); err != nil {
		switch {
		case errors.Is(err, jwt.ErrExpired):
			return fail("token expired at %s", std.Expiry.Time().UTC().Format(time.RFC3339))
		case errors.Is(err, jwt.ErrInvalidIssuer):
			return fail("token issuer %q is not %q", std.Issuer, v.Issuer)
		case errors.Is(err, jwt.ErrInvalidAudience):
			return fail("token audience %v does not include %q", []string(std.Audience), v.Audience)
		}
		return fail("token claims: %v", err)
	}
	return nil
}

// callerOf is the workload the verified claims c name.
func (v *JWTVerifier) callerOf(c claims) (Caller, error) {
	std := c.Claims
	ns, sa, podName, podUID, node := "", "", "", "", ""
	if k := c.Kubernetes; k != nil {
		ns, sa = k.Namespace, k.ServiceAccount.Name
		if k.Node != nil {
			node = k.Node.Name
			if err := events.ValidateNodeName(node); err != nil {
				return Caller{}, fail("token node claim: %v", err)
			}
		}
		if k.Pod != nil {
			podName, podUID = k.Pod.Name, k.Pod.UID
			// A pod claim that is present must name a pod: an empty or odd name is a
			// broken token, not a token without a pod binding.
			if err := events.ValidatePodID(podName); err != nil {
				return Caller{}, fail("token pod claim: %v", err)
			}
		}
	}
	if ns == "" || sa == "" {
		rest, ok := strings.CutPrefix(std.Subject, "system:serviceaccount:")
		parts := strings.Split(rest, ":")
		if !ok || len(parts) != 2 || parts[0] == "" || parts[1] == "" {
			return Caller{}, fail("token names no service account: no kubernetes.io claims and sub %q is not system:serviceaccount:<ns>:<sa>", std.Subject)
		}
		ns, sa = parts[0], parts[1]
	}
	id, err := pki.WorkloadID(v.TrustDomain, ns, sa)
	if err != nil {
		return Caller{}, fail("token identity: %v", err)
	}
	caller := Caller{ID: id.URL(), Source: SourceJWT, Expires: std.Expiry.Time()}
	if std.IssuedAt != nil {
		caller.Issued = std.IssuedAt.Time()
	}
	if podName != "" {
		// The pod is in the token's namespace, the one its identity names.
		caller.Pod, caller.PodUID, caller.Node = events.PodRef{Namespace: ns, Name: podName}, podUID, node
		if err := caller.Pod.Validate(); err != nil {
			return Caller{}, fail("token pod: %v", err)
		}
	}
	return caller, nil
}
