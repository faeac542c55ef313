package authn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
)

// maxJWKS bounds a JWKS or discovery document.
const maxJWKS = 1 << 20

// lookupTimeout bounds the fetch a token with an unknown key id triggers: the
// request that carries the token waits for it.
const lookupTimeout = 5 * time.Second

// KeySet is a JWKS read from a file, a URL, or the URL that the token issuer's OIDC
// discovery document names (Discover), and re-read every Refresh. A token signed by
// a key id the set does not hold triggers a re-read too, at most once per
// MinRefresh, so that a key the issuer just rotated in is accepted without waiting
// for the next Refresh while a stream of made-up key ids cannot turn into a stream
// of fetches. A failed read keeps the keys already loaded.
type KeySet struct {
	File string
	URL  string
	// Discover: read Issuer's discovery document
	// (<Issuer>/.well-known/openid-configuration), refuse it unless it names Issuer,
	// and fetch the jwks_uri it names. Kubernetes serves one for its service-account
	// token issuer.
	Discover bool
	Issuer   string
	// BearerFile holds a token sent as "Authorization: Bearer" with discovery and JWKS
	// requests, read again for each (Kubernetes' API server wants one unless anonymous
	// discovery is allowed; the signer's own service-account token is rotated on disk).
	BearerFile string
	Refresh    time.Duration // periodic re-read; 0: none
	MinRefresh time.Duration // floor between re-reads an unknown key id triggers
	Client     *http.Client
	Log        hclog.Logger
	Clock      clock.Clock // nil: the wall clock

	cur atomic.Pointer[jose.JSONWebKeySet]

	mu        sync.Mutex // serialises reads; guards lastFetch
	lastFetch time.Time  // start of the last read, successful or not
}

// StaticKeySet holds fixed keys (tests and embedded use).
func StaticKeySet(set jose.JSONWebKeySet) *KeySet {
	k := &KeySet{}
	k.cur.Store(&set)
	return k
}

// Current is the loaded key set (empty before Load).
func (k *KeySet) Current() *jose.JSONWebKeySet {
	if s := k.cur.Load(); s != nil {
		return s
	}
	return &jose.JSONWebKeySet{}
}

func (k *KeySet) clock() clock.Clock {
	if k.Clock != nil {
		return k.Clock
	}
	return clock.Real{}
}

func (k *KeySet) now() time.Time { return k.clock().Now() }

func (k *KeySet) hasSource() bool { return k.File != "" || k.URL != "" || k.Discover }

// Lookup returns the keys with key id kid. When there are none it re-reads the set
// once, unless the last read started less than MinRefresh ago, and looks again.
func (k *KeySet) Lookup(kid string) []jose.JSONWebKey {
	if keys := k.Current().Key(kid); len(keys) > 0 || !k.hasSource() {
		return keys
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	// Another caller may have read the set while this one waited for the lock.
	if keys := k.Current().Key(kid); len(keys) > 0 {
		return keys
	}
	if !k.lastFetch.IsZero() && k.now().Sub(k.lastFetch) < k.MinRefresh {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	if err := k.loadLocked(ctx); err != nil {
		if k.Log != nil {
			k.Log.Warn("jwks read for an unknown key id failed, keeping the loaded keys", "kid", kid, "error", err)
		}
		return nil
	}
	if k.Log != nil {
		k.Log.Info("jwks re-read for an unknown key id", "kid", kid, "found", len(k.Current().Key(kid)) > 0)
	}
	return k.Current().Key(kid)
}

// Load reads the key set once.
func (k *KeySet) Load(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.loadLocked(ctx)
}

func (k *KeySet) loadLocked(ctx context.Context) error {
	k.lastFetch = k.now()
	var data []byte
	var err error
	switch {
	case k.File != "":
		data, err = os.ReadFile(k.File)
	case k.Discover:
		var uri string
		if uri, err = k.discover(ctx); err == nil {
			data, err = k.get(ctx, uri, acceptJWKS)
		}
	case k.URL != "":
		data, err = k.get(ctx, k.URL, acceptJWKS)
	default:
		return errors.New("jwks: no file, url or discovery")
	}
	if err != nil {
		return fmt.Errorf("jwks: %w", err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return fmt.Errorf("jwks: %w", err)
	}
	if len(set.Keys) == 0 {
		return errors.New("jwks: no keys")
	}
	for _, key := range set.Keys {
		if !key.Valid() {
			return fmt.Errorf("jwks: invalid key %q", key.KeyID)
		}
	}
	k.cur.Store(&set)
	return nil
}

// discoveryDoc is the part of an OIDC provider's metadata (OpenID Connect Discovery
// 1.0, section 3) the signer needs.
type discoveryDoc struct {
	Issuer  string `json:"issuer"`
	JWKSURI string `json:"jwks_uri"`
}

// DiscoveryURL is where issuer's OIDC discovery document is.
func DiscoveryURL(issuer string) string {
	return strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
}

// discover reads the issuer's discovery document and returns its jwks_uri.
func (k *KeySet) discover(ctx context.Context) (string, error) {
	if !strings.HasPrefix(k.Issuer, "https://") {
		return "", fmt.Errorf("oidc discovery: issuer %q is not an https URL", k.Issuer)
	}
	u := DiscoveryURL(k.Issuer)
	data, err := k.get(ctx, u, "application/json")
	if err != nil {
		return "", fmt.Errorf("oidc discovery: %w", err)
	}
	var doc discoveryDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("oidc discovery %s: %w", u, err)
	}
	// OpenID Connect Discovery 1.0, 4.3: the document's issuer must be exactly the one
	// it was fetched for, or a document could speak for another issuer.
	if doc.Issuer != k.Issuer {
		return "", fmt.Errorf("oidc discovery %s: document is for issuer %q, not %q", u, doc.Issuer, k.Issuer)
	}
	if !strings.HasPrefix(doc.JWKSURI, "https://") {
		return "", fmt.Errorf("oidc discovery %s: jwks_uri %q is not an https URL", u, doc.JWKSURI)
	}
	return doc.JWKSURI, nil
}

// acceptJWKS asks for a JWKS by its media type (RFC 7517, section 8.5) first:
// Kubernetes' API server answers 406 Not Acceptable to a JWKS request that accepts
// only application/json.
const acceptJWKS = "application/jwk-set+json, application/json;q=0.9"

// get fetches url asking for the media types in accept.
func (k *KeySet) get(ctx context.Context, url, accept string) ([]byte, error) {
	c := k.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	if k.BearerFile != "" {
		tok, err := os.ReadFile(k.BearerFile)
		if err != nil {
			return nil, fmt.Errorf("bearer token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKS+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if len(data) > maxJWKS {
		return nil, fmt.Errorf("GET %s: document larger than %d bytes", url, maxJWKS)
	}
	return data, nil
}

// Run re-reads the key set every Refresh until ctx is done.
func (k *KeySet) Run(ctx context.Context) error {
	if k.Refresh <= 0 || !k.hasSource() {
		<-ctx.Done()
		return nil
	}
	t := k.clock().NewTimer(k.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			t.Reset(k.Refresh)
			if err := k.Load(ctx); err != nil && ctx.Err() == nil && k.Log != nil {
				k.Log.Warn("jwks refresh failed, keeping the loaded keys", "error", err)
			}
		}
	}
}
