package authn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/hashicorp/go-hclog"
)

// maxJWKS bounds a JWKS document.
const maxJWKS = 1 << 20

// KeySet is a JWKS read from a file or a URL and re-read every Refresh. A failed
// refresh keeps the keys already loaded.
type KeySet struct {
	File    string
	URL     string
	Refresh time.Duration
	Client  *http.Client
	Log     hclog.Logger

	cur atomic.Pointer[jose.JSONWebKeySet]
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

// Load reads the key set once.
func (k *KeySet) Load(ctx context.Context) error {
	var data []byte
	var err error
	switch {
	case k.File != "":
		data, err = os.ReadFile(k.File)
	case k.URL != "":
		data, err = k.fetch(ctx)
	default:
		return errors.New("jwks: no file or url")
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

func (k *KeySet) fetch(ctx context.Context) ([]byte, error) {
	c := k.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", k.URL, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, maxJWKS))
}

// Run re-reads the key set every Refresh until ctx is done.
func (k *KeySet) Run(ctx context.Context) error {
	if k.Refresh <= 0 || (k.File == "" && k.URL == "") {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(k.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := k.Load(ctx); err != nil && ctx.Err() == nil && k.Log != nil {
				k.Log.Warn("jwks refresh failed, keeping the loaded keys", "error", err)
			}
		}
	}
}
