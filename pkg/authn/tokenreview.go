package authn

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// PodNameExtra is the user extra in which the API server names the pod a
// service-account token is bound to (Kubernetes 1.29+ with pod-bound tokens).
const PodNameExtra = "authentication.kubernetes.io/pod-name"

// NodeNameExtra is the user extra in which the API server names the node the
// token's pod is scheduled on (Kubernetes 1.32 on, for a token bound to a pod).
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// PodUIDExtra is the user extra in which the API server gives that pod's UID.
const PodUIDExtra = "authentication.kubernetes.io/pod-uid"

// TokenReviewPath is where the API server takes TokenReviews.
const TokenReviewPath = "/apis/authentication.k8s.io/v1/tokenreviews"

const (
	reviewTimeout   = 5 * time.Second // one TokenReview request: the signing request waits for it
	maxReviewBody   = 1 << 20
	maxReviewCache  = 10000
	negativeCaching = 10 * time.Second // a refused token is asked about again no sooner
	// DefaultReviewCache is the longest a TokenReview verdict is reused.
	DefaultReviewCache = time.Minute
)

// TokenReviewer checks bearer tokens by asking the Kubernetes API server
// (authentication.k8s.io/v1 TokenReview), as istiod does by default: for clusters
// whose OIDC discovery the signer cannot reach. The signer's own service account
// needs the ClusterRole system:auth-delegator. A verdict is cached by a hash of the
// token, an admission until min(the token's exp, CacheTTL), a refusal for 10 s; an
// API server that does not answer is ErrUnavailable, never a verdict.
type TokenReviewer struct {
	URL         string // API server, https://host:port
	Client      *http.Client
	BearerFile  string // the signer's own token, re-read for each review
	Audience    string // required audience (istio-ca)
	TrustDomain string
	CacheTTL    time.Duration // 0: DefaultReviewCache
	Log         hclog.Logger
	Clock       clock.Clock // nil: the wall clock

	mu    sync.Mutex
	cache map[[32]byte]reviewVerdict
}

type reviewVerdict struct {
	caller Caller
	err    error // a refusal (ErrUnauthenticated), never ErrUnavailable
	until  time.Time
}

// Ready is always nil: each token is checked when it comes.
func (v *TokenReviewer) Ready() error { return nil }

func (v *TokenReviewer) now() time.Time {
	if v.Clock != nil {
		return v.Clock.Now()
	}
	return clock.Real{}.Now()
}

// Verify returns the caller the API server says token belongs to: the service
// account in status.user.username and the pod in its pod-name extra.
func (v *TokenReviewer) Verify(token string) (Caller, error) {
	if token == "" {
		return Caller{}, fail("empty token")
	}
	key := sha256.Sum256([]byte(token))
	now := v.now()
	v.mu.Lock()
	if e, ok := v.cache[key]; ok && now.Before(e.until) {
		v.mu.Unlock()
		return e.caller, e.err
	}
	v.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), reviewTimeout)
	defer cancel()
	st, err := v.review(ctx, token)
	if err != nil {
		return Caller{}, err
	}
	caller, verr := v.callerOf(token, st)
	until := now.Add(negativeCaching)
	if verr == nil {
		ttl := v.CacheTTL
		if ttl <= 0 {
			ttl = DefaultReviewCache
		}
		until = now.Add(ttl)
		if !caller.Expires.IsZero() && caller.Expires.Before(until) {
			until = caller.Expires
		}
	}
	v.remember(key, reviewVerdict{caller: caller, err: verr, until: until}, now)
	return caller, verr
}

func (v *TokenReviewer) remember(key [32]byte, e reviewVerdict, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cache == nil {
		v.cache = map[[32]byte]reviewVerdict{}
	}
	if len(v.cache) >= maxReviewCache {
		for k, old := range v.cache {
			if !now.Before(old.until) {
				delete(v.cache, k)
			}
		}
		if len(v.cache) >= maxReviewCache {
			clear(v.cache) // a flood of distinct tokens: start over rather than grow
		}
	}
	v.cache[key] = e
}

// reviewStatus is TokenReview's status (authentication.k8s.io/v1).
type reviewStatus struct {
	Authenticated bool `json:"authenticated"`
	User          struct {
		Username string              `json:"username"`
		Groups   []string            `json:"groups"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	Audiences []string `json:"audiences"`
	Error     string   `json:"error"`
}

type tokenReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Token     string   `json:"token"`
		Audiences []string `json:"audiences,omitempty"`
	} `json:"spec"`
	Status reviewStatus `json:"status"`
}

// review posts one TokenReview. Any failure to get a verdict is ErrUnavailable.
func (v *TokenReviewer) review(ctx context.Context, token string) (reviewStatus, error) {
	unavailable := func(format string, a ...any) (reviewStatus, error) {
		err := fmt.Errorf("%w: tokenreview at %s: %s", ErrUnavailable, v.URL, fmt.Sprintf(format, a...))
		if v.Log != nil {
			v.Log.Warn("tokenreview failed", "url", v.URL, "error", err)
		}
		return reviewStatus{}, err
	}
	var body tokenReview
	body.APIVersion, body.Kind = "authentication.k8s.io/v1", "TokenReview"
	body.Spec.Token, body.Spec.Audiences = token, []string{v.Audience}
	data, err := json.Marshal(body)
	if err != nil {
		return unavailable("%v", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(v.URL, "/")+TokenReviewPath, bytes.NewReader(data))
	if err != nil {
		return unavailable("%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	code, st, raw, err := callAPI(v.Client, v.BearerFile, req, maxReviewBody)
	if err != nil {
		return unavailable("%v", err)
	}
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return unavailable("%s: the signer's service account may not create tokenreviews (bind the ClusterRole system:auth-delegator to it)", st)
	case code != http.StatusOK && code != http.StatusCreated:
		return unavailable("%s", st)
	case len(raw) > maxReviewBody:
		return unavailable("answer larger than %d bytes", maxReviewBody)
	}
	var out tokenReview
	if err := json.Unmarshal(raw, &out); err != nil {
		return unavailable("answer is not a TokenReview: %v", err)
	}
	if out.Kind != "TokenReview" {
		return unavailable("answer is a %q, not a TokenReview", out.Kind)
	}
	return out.Status, nil
}

// callerOf turns an API server's verdict into the caller, or a refusal.
func (v *TokenReviewer) callerOf(token string, st reviewStatus) (Caller, error) {
	if !st.Authenticated {
		reason := st.Error
		if reason == "" {
			reason = "not authenticated"
		}
		return Caller{}, fail("api server refused the token: %s", reason)
	}
	// The API server returns the audiences of the token that were asked for; an
	// older one that ignores spec.audiences returns none.
	if !slices.Contains(st.Audiences, v.Audience) {
		return Caller{}, fail("token audiences %v do not include %q", st.Audiences, v.Audience)
	}
	rest, ok := strings.CutPrefix(st.User.Username, "system:serviceaccount:")
	parts := strings.Split(rest, ":")
	if !ok || len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return Caller{}, fail("token of %q is not a service account's (system:serviceaccount:<ns>:<sa>)", st.User.Username)
	}
	id, err := pki.WorkloadID(v.TrustDomain, parts[0], parts[1])
	if err != nil {
		return Caller{}, fail("token identity: %v", err)
	}
	c := Caller{ID: id.URL(), Source: SourceJWT} // a service-account token, as offline
	if pods := st.User.Extra[PodNameExtra]; len(pods) > 0 {
		if len(pods) != 1 {
			return Caller{}, fail("token names %d pods", len(pods))
		}
		c.Pod = events.PodRef{Namespace: parts[0], Name: pods[0]}
		if err := c.Pod.Validate(); err != nil {
			return Caller{}, fail("token pod: %v", err)
		}
		if uids := st.User.Extra[PodUIDExtra]; len(uids) == 1 {
			c.PodUID = uids[0]
		}
		if nodes := st.User.Extra[NodeNameExtra]; len(nodes) == 1 {
			if err := events.ValidateNodeName(nodes[0]); err != nil {
				return Caller{}, fail("token node: %v", err)
			}
			c.Node = nodes[0]
		}
	}
	// TokenReview says nothing of expiry; the token's own exp does, and the API
	// server has just vouched for the token it is read from.
	if tok, err := jwt.ParseSigned(token, tokenAlgs); err == nil {
		var claims jwt.Claims
		if err := tok.UnsafeClaimsWithoutVerification(&claims); err == nil && claims.Expiry != nil {
			c.Expires = claims.Expiry.Time()
		}
	}
	return c, nil
}

// In a pod, the files of its service account (client-go's in-cluster config).
const (
	InClusterTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	InClusterCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// InClusterURL is the API server's URL in a pod, from KUBERNETES_SERVICE_HOST and
// KUBERNETES_SERVICE_PORT as the kubelet sets them; "" outside a pod.
func InClusterURL(getenv func(string) string) string {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return ""
	}
	return "https://" + net.JoinHostPort(host, port)
}
