package federation

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Config of a Follower.
type Config struct {
	// Self is this trust domain: never followed, its roots come from the CA.
	Self spiffeid.TrustDomain
	// WebPKIRoots authenticate bundle endpoints; nil uses the system roots.
	WebPKIRoots *x509.CertPool
	// MinRefresh and MaxRefresh clamp a bundle's spiffe_refresh_hint;
	// DefaultRefresh is used when a bundle has none. Errors retry after MinRefresh.
	MinRefresh, MaxRefresh, DefaultRefresh time.Duration
	// FetchTimeout bounds one fetch.
	FetchTimeout time.Duration
	// OnBundle, if set, is called (outside locks) after every good fetch of a
	// domain's bundle, changed or not, so that listeners that came late catch
	// up within one refresh; b is nil when the domain is no longer followed.
	OnBundle func(td spiffeid.TrustDomain, b *spiffebundle.Bundle)
}

// Status is what is known about one followed trust domain.
type Status struct {
	TrustDomain string
	Where       string
	Roots       int
	Sequence    uint64
	RefreshHint time.Duration
	FetchedAt   time.Time // last good fetch; zero if none
	NextRefresh time.Time
	Err         string // last fetch error, "" after a good one
}

// Follower fetches foreign trust domains' bundles and keeps them, one bundle
// per domain, refreshing each by its hint. A failed refresh keeps the last
// good bundle. It is safe for concurrent use.
type Follower struct {
	cfg  Config
	wake chan struct{}

	mu      sync.Mutex
	sources map[spiffeid.TrustDomain]Source
	bundles map[spiffeid.TrustDomain]*spiffebundle.Bundle
	status  map[spiffeid.TrustDomain]*Status
}

// NewFollower checks cfg and fills its defaults; it starts nothing.
func NewFollower(cfg Config) (*Follower, error) {
	if cfg.Self.IsZero() {
		return nil, errors.New("federation: no trust domain of our own")
	}
	if cfg.MinRefresh <= 0 {
		cfg.MinRefresh = 10 * time.Second
	}
	if cfg.MaxRefresh <= 0 {
		cfg.MaxRefresh = time.Hour
	}
	if cfg.DefaultRefresh <= 0 {
		cfg.DefaultRefresh = 5 * time.Minute
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 10 * time.Second
	}
	if cfg.MinRefresh > cfg.MaxRefresh {
		return nil, fmt.Errorf("federation: min refresh %v above max refresh %v", cfg.MinRefresh, cfg.MaxRefresh)
	}
	return &Follower{cfg: cfg, wake: make(chan struct{}, 1),
		sources: map[spiffeid.TrustDomain]Source{},
		bundles: map[spiffeid.TrustDomain]*spiffebundle.Bundle{},
		status:  map[spiffeid.TrustDomain]*Status{}}, nil
}

// Follow replaces the followed domains with srcs. A domain no longer listed is
// dropped at once (its roots stop being trusted); a new or changed one is
// fetched on the next round. Bad input changes nothing.
func (f *Follower) Follow(srcs []Source) error {
	next := map[spiffeid.TrustDomain]Source{}
	for _, s := range srcs {
		switch {
		case s.TrustDomain == f.cfg.Self:
			return fmt.Errorf("federation: %q is our own trust domain", s.TrustDomain)
		case s.TrustDomain.IsZero():
			return errors.New("federation: source without trust domain")
		case (s.URL == "") == (s.File == ""):
			return fmt.Errorf("federation: %q needs exactly one of URL and file", s.TrustDomain)
		case !s.EndpointID.IsZero() && (s.URL == "" || s.Bootstrap == "" || s.EndpointID.TrustDomain() != s.TrustDomain):
			return fmt.Errorf("federation: %q: an https_spiffe source needs a URL, a bootstrap bundle and an endpoint ID in its own domain", s.TrustDomain)
		}
		if _, dup := next[s.TrustDomain]; dup {
			return fmt.Errorf("federation: %q given twice", s.TrustDomain)
		}
		next[s.TrustDomain] = s
	}
	var dropped []spiffeid.TrustDomain
	f.mu.Lock()
	for td, old := range f.sources {
		if s, ok := next[td]; !ok || s != old {
			delete(f.bundles, td)
			delete(f.status, td)
			if !ok {
				dropped = append(dropped, td)
			}
		}
	}
	for td, s := range next {
		if _, ok := f.status[td]; !ok {
			f.status[td] = &Status{TrustDomain: td.Name(), Where: s.Where()}
		}
	}
	f.sources = next
	f.mu.Unlock()
	if f.cfg.OnBundle != nil {
		for _, td := range dropped {
			f.cfg.OnBundle(td, nil)
		}
	}
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return nil
}

// Bundles returns a copy of the foreign bundles held now, one per domain.
func (f *Follower) Bundles() *spiffebundle.Set {
	f.mu.Lock()
	defer f.mu.Unlock()
	set := spiffebundle.NewSet()
	for _, b := range f.bundles {
		set.Add(b.Clone())
	}
	return set
}

// Status lists the followed domains, sorted by name.
func (f *Follower) Status() []Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Status, 0, len(f.status))
	for _, s := range f.status {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Status) int {
		if a.TrustDomain < b.TrustDomain {
			return -1
		}
		if a.TrustDomain > b.TrustDomain {
			return 1
		}
		return 0
	})
	return out
}

// Run refreshes every followed domain when it is due until ctx ends.
func (f *Follower) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-f.wake:
		}
		next := f.round(ctx)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Until(next))
	}
}

// round fetches every due domain and returns when the next one is due.
func (f *Follower) round(ctx context.Context) time.Time {
	now := time.Now()
	f.mu.Lock()
	var due []Source
	for td, s := range f.sources {
		if st := f.status[td]; st.NextRefresh.IsZero() || !now.Before(st.NextRefresh) {
			due = append(due, s)
		}
	}
	f.mu.Unlock()
	for _, s := range due {
		b, err := f.fetch(ctx, s)
		f.record(s, b, err)
	}
	next := time.Now().Add(f.cfg.MaxRefresh)
	f.mu.Lock()
	for _, st := range f.status {
		if st.NextRefresh.Before(next) {
			next = st.NextRefresh
		}
	}
	f.mu.Unlock()
	return next
}

func (f *Follower) fetch(ctx context.Context, s Source) (*spiffebundle.Bundle, error) {
	var b *spiffebundle.Bundle
	var err error
	if s.File != "" {
		b, err = spiffebundle.Load(s.TrustDomain, s.File)
	} else {
		ctx, cancel := context.WithTimeout(ctx, f.cfg.FetchTimeout)
		defer cancel()
		var opts []federation.FetchOption
		switch {
		case !s.EndpointID.IsZero():
			auth, err := f.endpointBundle(s)
			if err != nil {
				return nil, err
			}
			opts = append(opts, federation.WithSPIFFEAuth(auth, s.EndpointID))
		case f.cfg.WebPKIRoots != nil:
			opts = append(opts, federation.WithWebPKIRoots(f.cfg.WebPKIRoots))
		}
		b, err = federation.FetchBundle(ctx, s.TrustDomain, s.URL, opts...)
	}
	if err != nil {
		return nil, err
	}
	if len(b.X509Authorities()) == 0 {
		return nil, fmt.Errorf("bundle of %q has no X.509 authorities", s.TrustDomain)
	}
	return b, nil
}

// endpointBundle is what authenticates s's https_spiffe endpoint: the domain's
// bundle fetched last (so a root the domain rotated to since is known), else its
// bootstrap bundle.
func (f *Follower) endpointBundle(s Source) (*spiffebundle.Bundle, error) {
	f.mu.Lock()
	b := f.bundles[s.TrustDomain]
	f.mu.Unlock()
	if b != nil {
		return b, nil
	}
	b, err := spiffebundle.Load(s.TrustDomain, s.Bootstrap)
	if err != nil {
		return nil, fmt.Errorf("bootstrap bundle of %s: %w", s.TrustDomain, err)
	}
	return b, nil
}

// record keeps a fetched bundle (or the error, keeping the last good bundle)
// unless the source changed while fetching.
func (f *Follower) record(s Source, b *spiffebundle.Bundle, err error) {
	now := time.Now()
	f.mu.Lock()
	if f.sources[s.TrustDomain] != s {
		f.mu.Unlock()
		return
	}
	st := f.status[s.TrustDomain]
	if err != nil {
		st.Err = err.Error()
		st.NextRefresh = now.Add(f.cfg.MinRefresh)
	} else {
		f.bundles[s.TrustDomain] = b
		hint, ok := b.RefreshHint()
		if !ok {
			hint = f.cfg.DefaultRefresh
		}
		st.RefreshHint = hint
		hint = min(max(hint, f.cfg.MinRefresh), f.cfg.MaxRefresh)
		seq, _ := b.SequenceNumber()
		st.Err, st.Roots, st.Sequence, st.FetchedAt, st.NextRefresh = "", len(b.X509Authorities()), seq, now, now.Add(hint)
	}
	f.mu.Unlock()
	if err == nil && f.cfg.OnBundle != nil {
		f.cfg.OnBundle(s.TrustDomain, b.Clone())
	}
}
