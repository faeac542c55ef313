package federation

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
)

// Config of a Follower.
type Config struct {
	// Self is this trust domain: never followed, its roots come from the CA.
	Self spiffeid.TrustDomain
	// Aliases are trust domains accepted as Self (TRUST_DOMAIN_ALIASES): never
	// followed either, their IDs verify against our own roots.
	Aliases []spiffeid.TrustDomain
	// WebPKIRoots authenticate bundle endpoints; nil uses the system roots.
	WebPKIRoots *x509.CertPool
	// MinRefresh and MaxRefresh clamp a bundle's spiffe_refresh_hint;
	// DefaultRefresh is used when a bundle has none. Errors retry after MinRefresh.
	MinRefresh, MaxRefresh, DefaultRefresh time.Duration
	// FetchTimeout bounds one fetch.
	FetchTimeout time.Duration
	// MaxBundleSize bounds a fetched bundle's body and a bundle file, in bytes
	// (0: DefaultMaxBundleSize). A larger one is refused, never cut.
	MaxBundleSize int64
	// OnBundle, if set, is called (outside locks) after every good fetch of a
	// domain's bundle, changed or not, so that listeners that came late catch
	// up within one refresh, with the status the domain will have; b is nil
	// when the domain is no longer followed. An error (the bundle could not be
	// announced) fails the refresh: the bundle is not kept, and the domain
	// shows the error with ReasonAnnounce unless the error carries its own.
	OnBundle func(td spiffeid.TrustDomain, b *spiffebundle.Bundle, st Status) error
	// OnFailure, if set, is called (outside locks) after every failed refresh,
	// with first set when the domain was not failing before: for the log.
	OnFailure func(td spiffeid.TrustDomain, st Status, first bool)
}

// Status is what is known about one followed trust domain.
type Status struct {
	TrustDomain string
	Where       string
	Roots       int
	RootInfo    []Root // the roots held, in the bundle's order
	Sequence    uint64
	RefreshHint time.Duration
	FetchedAt   time.Time // last success (fetched and announced); zero if none
	NextRefresh time.Time
	Err         string // the current failure, "" after a success
	ErrReason   string // its Reason
	// LastErr is the last failure, kept after a success, at LastErrAt.
	LastErr       string
	LastErrReason string
	LastErrAt     time.Time
	// Errors counts failed refreshes by reason since the domain was followed
	// (from this source).
	Errors map[string]uint64
}

// Root is one root of a followed domain, for people: its SHA-256 (of the DER),
// subject and end of validity.
type Root struct {
	SHA256   string
	Subject  string
	NotAfter time.Time
}

func (s Status) clone() Status {
	s.RootInfo = slices.Clone(s.RootInfo)
	s.Errors = maps.Clone(s.Errors)
	return s
}

// maxErrLen bounds an error kept in a Status (an endpoint's error page can be
// long, and status travels in bounded replies).
const maxErrLen = 512

// Follower fetches foreign trust domains' bundles and keeps them, one bundle
// per domain, refreshing each by its hint. A failed refresh keeps the last
// good bundle. It is safe for concurrent use.
type Follower struct {
	cfg  Config
	clk  clock.Clock // when refreshes are due, and what they are stamped with
	wake chan struct{}

	mu      sync.Mutex
	sources map[spiffeid.TrustDomain]Source
	bundles map[spiffeid.TrustDomain]*spiffebundle.Bundle
	status  map[spiffeid.TrustDomain]*Status
}

// NewFollower checks cfg and fills its defaults; refreshes are due, and stamped,
// by clk. It starts nothing.
func NewFollower(cfg Config, clk clock.Clock) (*Follower, error) {
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
	if cfg.MaxBundleSize <= 0 {
		cfg.MaxBundleSize = DefaultMaxBundleSize
	}
	if cfg.MinRefresh > cfg.MaxRefresh {
		return nil, fmt.Errorf("federation: min refresh %v above max refresh %v", cfg.MinRefresh, cfg.MaxRefresh)
	}
	return &Follower{cfg: cfg, clk: clk, wake: make(chan struct{}, 1),
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
		case slices.Contains(f.cfg.Aliases, s.TrustDomain):
			return fmt.Errorf("federation: %q is an alias of our own trust domain", s.TrustDomain)
		case s.TrustDomain.IsZero():
			return errors.New("federation: source without trust domain")
		case CanonicalTrustDomain(s.TrustDomain.Name()) != nil:
			return fmt.Errorf("federation: %w", CanonicalTrustDomain(s.TrustDomain.Name()))
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
			_ = f.cfg.OnBundle(td, nil, Status{TrustDomain: td.Name()})
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
		out = append(out, s.clone())
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
	timer := f.clk.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C():
		case <-f.wake:
		}
		next := f.round(ctx)
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
		timer.Reset(next.Sub(f.clk.Now()))
	}
}

// round fetches every due domain and returns when the next one is due.
func (f *Follower) round(ctx context.Context) time.Time {
	now := f.clk.Now()
	f.mu.Lock()
	var due []Source
	for td, s := range f.sources {
		if st := f.status[td]; st.NextRefresh.IsZero() || !now.Before(st.NextRefresh) {
			due = append(due, s)
		}
	}
	f.mu.Unlock()
	for _, s := range due {
		f.refresh(ctx, s)
	}
	next := f.clk.Now().Add(f.cfg.MaxRefresh)
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
	if s.File != "" {
		return loadFile(s.TrustDomain, s.File, f.cfg.MaxBundleSize)
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.FetchTimeout)
	defer cancel()
	tlsConf := &tls.Config{RootCAs: f.cfg.WebPKIRoots, MinVersion: tls.VersionTLS12}
	if !s.EndpointID.IsZero() {
		auth, err := f.endpointBundle(s)
		if err != nil {
			return nil, err
		}
		tlsConf = tlsconfig.TLSClientConfig(auth, tlsconfig.AuthorizeID(s.EndpointID))
	}
	return fetchURL(ctx, s.TrustDomain, s.URL, tlsConf, f.cfg.MaxBundleSize)
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
	b, err := loadFile(s.TrustDomain, s.Bootstrap, f.cfg.MaxBundleSize)
	if err != nil {
		return nil, &FetchError{Reason: Reason(err), Err: fmt.Errorf("bootstrap bundle of %s: %w", s.TrustDomain, err)}
	}
	return b, nil
}

// refresh fetches s's bundle, hands it to OnBundle and records the outcome.
func (f *Follower) refresh(ctx context.Context, s Source) {
	b, err := f.fetch(ctx, s)
	now := f.clk.Now()
	if err == nil && f.cfg.OnBundle != nil {
		f.mu.Lock()
		st := f.status[s.TrustDomain]
		if f.sources[s.TrustDomain] != s || st == nil {
			f.mu.Unlock()
			return // the source changed while fetching
		}
		next := st.clone()
		f.mu.Unlock()
		f.succeeded(&next, b, now)
		if aerr := f.cfg.OnBundle(s.TrustDomain, b.Clone(), next); aerr != nil {
			var fe *FetchError
			if !errors.As(aerr, &fe) {
				aerr = &FetchError{Reason: ReasonAnnounce, Err: fmt.Errorf("fetched but not announced: %w", aerr)}
			}
			err = aerr
		}
	}
	st, first, failed := f.record(s, b, err, now)
	if failed && f.cfg.OnFailure != nil {
		f.cfg.OnFailure(s.TrustDomain, st, first)
	}
}

// record keeps a fetched bundle (or the error, keeping the last good bundle)
// unless the source changed meanwhile; after an error it returns the domain's
// status, whether it was not failing before, and failed.
func (f *Follower) record(s Source, b *spiffebundle.Bundle, err error, now time.Time) (_ Status, first, failed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sources[s.TrustDomain] != s {
		return Status{}, false, false
	}
	st := f.status[s.TrustDomain]
	if err != nil {
		first = st.Err == ""
		msg := err.Error()
		if len(msg) > maxErrLen {
			msg = msg[:maxErrLen] + "..."
		}
		reason := Reason(err)
		st.Err, st.ErrReason = msg, reason
		st.LastErr, st.LastErrReason, st.LastErrAt = msg, reason, now
		if st.Errors == nil {
			st.Errors = map[string]uint64{}
		}
		st.Errors[reason]++
		st.NextRefresh = now.Add(f.cfg.MinRefresh)
		return st.clone(), first, true
	}
	f.bundles[s.TrustDomain] = b
	f.succeeded(st, b, now)
	return Status{}, false, false
}

// succeeded sets st to what a good fetch of b at now makes it.
func (f *Follower) succeeded(st *Status, b *spiffebundle.Bundle, now time.Time) {
	hint, ok := b.RefreshHint()
	if !ok {
		hint = f.cfg.DefaultRefresh
	}
	st.RefreshHint = hint
	hint = min(max(hint, f.cfg.MinRefresh), f.cfg.MaxRefresh)
	seq, _ := b.SequenceNumber()
	roots := b.X509Authorities()
	st.RootInfo = make([]Root, 0, len(roots))
	for _, r := range roots {
		sum := sha256.Sum256(r.Raw)
		st.RootInfo = append(st.RootInfo, Root{SHA256: hex.EncodeToString(sum[:]), Subject: r.Subject.String(), NotAfter: r.NotAfter})
	}
	st.Err, st.ErrReason, st.Roots, st.Sequence, st.FetchedAt, st.NextRefresh = "", "", len(roots), seq, now, now.Add(hint)
}
