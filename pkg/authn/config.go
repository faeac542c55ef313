package authn

import (
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

// Config says how bearer tokens are verified: offline against a JWKS (a file, a
// URL, or the one the issuer's OIDC discovery document names), or by the API
// server's TokenReview. The signer and the node agent read it with the same flags.
type Config struct {
	JWKSFile    string
	JWKSURL     string
	JWKSRefresh time.Duration
	// JWKSMinRefresh is the floor between JWKS re-reads that tokens with an
	// unknown key id trigger.
	JWKSMinRefresh time.Duration
	// Discover: take the JWKS from Issuer's OIDC discovery document (Kubernetes'
	// service-account issuer serves one).
	Discover   bool
	CAFile     string // PEM roots for HTTPS to the issuer and its JWKS; empty: system roots
	BearerFile string // token sent with discovery and JWKS requests
	Issuer     string
	Audience   string
	// TokenReview: ask the API server (authentication.k8s.io/v1 TokenReview)
	// instead of verifying offline, where discovery and the JWKS are not reachable.
	TokenReview      bool
	TokenReviewURL   string        // API server; default: in-cluster (KUBERNETES_SERVICE_HOST/PORT)
	TokenReviewCache time.Duration // longest a verdict is reused (never past the token's exp)
}

// DefaultConfig is the defaults: meshctl's dev issuer and Istio's audience.
func DefaultConfig() Config {
	return Config{JWKSRefresh: 5 * time.Minute, JWKSMinRefresh: 10 * time.Second, Issuer: "meshagent-dev",
		Audience: "istio-ca", TokenReviewCache: DefaultReviewCache}
}

// Bind registers the flags (and env vars) of c on fs.
func (c *Config) Bind(fs *flagenv.Set, getenv func(string) string) {
	fs.String(&c.JWKSFile, "jwks-file", "JWKS_FILE", "", "JWKS file to verify bearer tokens")
	fs.String(&c.JWKSURL, "jwks-url", "JWKS_URL", "", "JWKS URL to verify bearer tokens, re-fetched every -jwks-refresh")
	fs.Duration(&c.JWKSRefresh, "jwks-refresh", "JWKS_REFRESH", c.JWKSRefresh, "how often to re-read the JWKS (the key cache's lifetime)")
	fs.Duration(&c.JWKSMinRefresh, "jwks-min-refresh", "JWKS_MIN_REFRESH", c.JWKSMinRefresh, "a token with an unknown key id re-reads the JWKS at most this often")
	fs.Bool(&c.Discover, "token-issuer-discovery", "TOKEN_ISSUER_DISCOVERY", false, "read the JWKS from the jwks_uri of -token-issuer's OIDC discovery document (<issuer>/.well-known/openid-configuration), as Kubernetes serves it")
	fs.Bool(&c.TokenReview, "token-review", "TOKEN_REVIEW", false, "verify bearer tokens by the API server's TokenReview (needs the ClusterRole system:auth-delegator), where OIDC discovery is not reachable; -token-issuer is then not checked")
	fs.String(&c.TokenReviewURL, "token-review-url", "TOKEN_REVIEW_URL", InClusterURL(getenv), "API server for -token-review (default in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.Duration(&c.TokenReviewCache, "token-review-cache", "TOKEN_REVIEW_CACHE", c.TokenReviewCache, "longest a TokenReview verdict is reused, never past the token's exp (refusals: 10s)")
	fs.String(&c.CAFile, "token-issuer-ca-file", "TOKEN_ISSUER_CA_FILE", "", "PEM roots for HTTPS to the token issuer and its JWKS, or to the API server with -token-review (in a pod: "+InClusterCAFile+", the default with -token-review); empty: system roots")
	fs.String(&c.BearerFile, "token-issuer-bearer-file", "TOKEN_ISSUER_BEARER_FILE", "", "token sent as Authorization: Bearer with discovery, JWKS and TokenReview requests, re-read for each (in a pod: "+InClusterTokenFile+", the default with -token-review)")
	fs.String(&c.Issuer, "token-issuer", "TOKEN_ISSUER", c.Issuer, "required iss of bearer tokens")
	fs.String(&c.Audience, "token-audience", "TOKEN_AUDIENCE", c.Audience, "required aud of bearer tokens")
}

// Defaults fills what follows from the flags: with -token-review in a pod, the
// service account's own CA and token files, as client-go's in-cluster config.
func (c *Config) Defaults() {
	if c.TokenReview {
		if c.CAFile == "" {
			c.CAFile = InClusterCAFile
		}
		if c.BearerFile == "" {
			c.BearerFile = InClusterTokenFile
		}
	}
}

// Sources is how many ways of verifying tokens are set (0: tokens are refused).
func (c Config) Sources() int {
	n := 0
	for _, set := range []bool{c.JWKSFile != "", c.JWKSURL != "", c.Discover, c.TokenReview} {
		if set {
			n++
		}
	}
	return n
}

// Validate adds every problem of c to p, naming the flag.
func (c Config) Validate(p *flagenv.Problems) {
	sources := c.Sources()
	p.Check(sources <= 1, "-jwks-file, -jwks-url, -token-issuer-discovery, -token-review: set one, not several")
	p.Check(c.JWKSRefresh > 0, "-jwks-refresh: must be positive")
	p.Check(c.JWKSMinRefresh >= 0, "-jwks-min-refresh: must not be negative")
	if sources > 0 {
		p.Check(c.Issuer != "" || c.TokenReview, "-token-issuer: required with a JWKS")
		p.Check(c.Audience != "", "-token-audience: required to verify bearer tokens")
	}
	if c.TokenReview {
		p.Check(strings.HasPrefix(c.TokenReviewURL, "https://"), "-token-review-url: must be an https URL with -token-review, got %q (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)", c.TokenReviewURL)
		p.Check(c.TokenReviewCache >= 0 && c.TokenReviewCache <= 5*time.Minute, "-token-review-cache: must be between 0 and 5m (a deleted pod's token is honoured that long)")
	}
	if c.Discover {
		p.Check(strings.HasPrefix(c.Issuer, "https://"), "-token-issuer: must be an https URL with -token-issuer-discovery, got %q (kubectl get --raw /.well-known/openid-configuration shows the cluster's)", c.Issuer)
	}
	p.Check(c.JWKSFile == "" || (c.CAFile == "" && c.BearerFile == ""), "-token-issuer-ca-file, -token-issuer-bearer-file: only with -jwks-url, -token-issuer-discovery or -token-review")
}

// TokenVerifier checks a bearer token (JWTVerifier, TokenReviewer).
type TokenVerifier interface {
	Verify(token string) (Caller, error)
	// Ready is nil once the verifier can check tokens (its keys are loaded).
	Ready() error
}

var (
	_ TokenVerifier = (*JWTVerifier)(nil)
	_ TokenVerifier = (*TokenReviewer)(nil)
)

// Build makes what c says verifies tokens for trustDomain, and the key set it
// reads (to Run; nil with TokenReview); a nil verifier when no way is set.
func (c Config) Build(trustDomain string, clk clock.Clock, log hclog.Logger) (TokenVerifier, *KeySet, error) {
	if c.Sources() == 0 {
		return nil, nil, nil
	}
	client, err := NewHTTPClient(c.CAFile)
	if err != nil {
		return nil, nil, fail("-token-issuer-ca-file: %v", err)
	}
	if c.TokenReview {
		return &TokenReviewer{URL: c.TokenReviewURL, Client: client, BearerFile: c.BearerFile, Audience: c.Audience,
			TrustDomain: trustDomain, CacheTTL: c.TokenReviewCache, Log: log.Named("tokenreview"), Clock: clk}, nil, nil
	}
	keys := &KeySet{File: c.JWKSFile, URL: c.JWKSURL, Discover: c.Discover, Issuer: c.Issuer,
		BearerFile: c.BearerFile, Refresh: c.JWKSRefresh, MinRefresh: c.JWKSMinRefresh,
		Client: client, Log: log.Named("jwks"), Clock: clk}
	return &JWTVerifier{Keys: keys, Issuer: c.Issuer, Audience: c.Audience, TrustDomain: trustDomain, Leeway: 30 * time.Second, Clock: clk}, keys, nil
}
