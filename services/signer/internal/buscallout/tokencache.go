package buscallout

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
)

// tokenCache keeps the callers of tokens verified lately, by the token's SHA-256,
// so that a pod's other connections (its three roles connecting at once, a
// reconnect wave) are admitted without verifying the same token again. An entry
// lives at most ttl and never past its token's expiry; only verified tokens are
// kept, so a refused token is checked every time. Bounded: when full, expired
// entries go first, then arbitrary ones (a miss costs one verification).
type tokenCache struct {
	mu      sync.Mutex
	max     int
	ttl     time.Duration
	entries map[[sha256.Size]byte]cached
}

type cached struct {
	caller authn.Caller
	until  time.Time
}

func newTokenCache(max int, ttl time.Duration) *tokenCache {
	return &tokenCache{max: max, ttl: ttl, entries: make(map[[sha256.Size]byte]cached)}
}

// get returns the caller of token when it was verified within ttl before now and
// has not expired.
func (c *tokenCache) get(token string, now time.Time) (authn.Caller, bool) {
	key := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return authn.Caller{}, false
	}
	if !now.Before(e.until) {
		delete(c.entries, key)
		return authn.Caller{}, false
	}
	return e.caller, true
}

// put keeps caller as the verified caller of token from now.
func (c *tokenCache) put(token string, caller authn.Caller, now time.Time) {
	until := now.Add(c.ttl)
	if caller.Expires.Before(until) {
		until = caller.Expires
	}
	if !now.Before(until) {
		return
	}
	key := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		for k, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.max {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = cached{caller: caller, until: until}
}

// len is how many tokens are kept.
func (c *tokenCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
