package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Istio's cacerts file names.
const (
	CACertFile    = "ca-cert.pem"
	CAKeyFile     = "ca-key.pem"
	CertChainFile = "cert-chain.pem"
	RootCertFile  = "root-cert.pem"
)

// ErrNotSupported is returned for a forced rotation in plugged-in mode.
var ErrNotSupported = errors.New("plugged-in CA: rotate by replacing the cacerts directory")

// LoadDir reads an Istio cacerts directory and validates it: the key matches
// ca-cert.pem, which chains (through cert-chain.pem) to a root in root-cert.pem. The
// generation is the newest file's modification time, so replicas reading the same
// directory agree on it.
func LoadDir(dir string, now time.Time) (*Material, error) {
	read := func(name string, required bool) ([]byte, time.Time, error) {
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if err != nil {
			if !required && errors.Is(err, os.ErrNotExist) {
				return nil, time.Time{}, nil
			}
			return nil, time.Time{}, fmt.Errorf("%w: %v", ErrInvalidMaterial, err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("%w: %v", ErrInvalidMaterial, err)
		}
		return b, st.ModTime(), nil
	}
	var newest time.Time
	files := map[string][]byte{}
	for _, f := range []struct {
		name     string
		required bool
	}{{CACertFile, true}, {CAKeyFile, true}, {CertChainFile, false}, {RootCertFile, true}} {
		b, mt, err := read(f.name, f.required)
		if err != nil {
			return nil, err
		}
		if mt.After(newest) {
			newest = mt
		}
		files[f.name] = b
	}
	key, err := pki.ParseKeyPEM(files[CAKeyFile])
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidMaterial, CAKeyFile, err)
	}
	certs, err := pki.ParseCertsPEM(files[CACertFile])
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidMaterial, CACertFile, err)
	}
	roots, err := pki.ParseCertsPEM(files[RootCertFile])
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidMaterial, RootCertFile, err)
	}
	inter := certs[1:]
	if len(files[CertChainFile]) > 0 {
		chain, err := pki.ParseCertsPEM(files[CertChainFile])
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalidMaterial, CertChainFile, err)
		}
		inter = append(inter, chain...)
	}
	return NewMaterial(key, certs[0], inter, roots, uint64(newest.UnixNano()), now)
}

// Plugged serves CA material from an Istio cacerts directory and reloads it when the
// directory changes, keeping the old material when the new is invalid.
type Plugged struct {
	dir         string
	delay       time.Duration
	trustDomain string
	auth        *Authority
	log         hclog.Logger
	clk         clock.Clock
	rejected    atomic.Uint64
	ann         *announcer
	// ForceRootChange installs a reload whose CA does not chain to a root trusted
	// now (see ErrFleetWouldRefuse); set before Run.
	ForceRootChange bool
	// Keeper keeps the roots of the material installed last across restarts, so that
	// a start-up checks the directory against them as a reload does; nil: a
	// start-up takes whatever the directory holds. Set before Start.
	Keeper Keeper
	// kept are the roots the fleet trusts as of the last installed material (from
	// Keeper at Start), checked against while nothing is installed.
	kept []*x509.Certificate
	// ExtraRoots join the trust bundle after root-cert.pem's (Material.AddRoots):
	// an external signer's, when the signer is a registration authority. Set
	// before Start.
	ExtraRoots []*x509.Certificate
}

// load reads the directory and adds ExtraRoots to its bundle.
func (p *Plugged) load() (*Material, error) {
	m, err := LoadDir(p.dir, p.now())
	if err != nil {
		return nil, err
	}
	if err := m.AddRoots(p.ExtraRoots); err != nil {
		return nil, err
	}
	return m, nil
}

// Keeper keeps the roots of the plugged-in material installed last.
type Keeper interface {
	Kept(ctx context.Context) ([]*x509.Certificate, error) // nil: none kept
	Keep(ctx context.Context, roots []*x509.Certificate) error
}

// ErrFleetWouldRefuse is a reload whose CA certificate does not chain to any root in
// the current bundle: pods trusting the bundle would refuse its trust bundle (its
// endorsement verifies under no root they trust) and its certificates, and expire.
var ErrFleetWouldRefuse = errors.New("the new CA material would strand the fleet")

// continuous checks that next's CA certificate chains, through next's own chain, to
// a root of cur's bundle: the new root is cross-signed by a current one (its
// cross certificate in cert-chain.pem), or the root stays and only the CA below it
// changes. Then pods follow the change; otherwise they cannot.
func continuous(cur, next *Material, now time.Time) error {
	return continuousFrom(cur.Roots, next, now)
}

// continuousFrom is continuous from the roots trusted now.
func continuousFrom(trusted []*x509.Certificate, next *Material, now time.Time) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range trusted {
		roots.AddCert(r)
	}
	for _, c := range append(next.Chain[1:], next.given...) {
		inter.AddCert(c)
	}
	if _, err := next.Cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("%w: the CA certificate %q does not chain to any root trusted now (%d in the bundle): pods would refuse its bundle and its certificates; "+
			"put the new root cross-signed by the current one in %s first (or keep the current root), or set -cacerts-force-root-change: %v",
			ErrFleetWouldRefuse, next.Cert.Subject, len(trusted), CertChainFile, err)
	}
	return nil
}

// Rejected counts reloads refused because the new material was invalid.
func (p *Plugged) Rejected() uint64 { return p.rejected.Load() }

// NewPlugged returns the plugged-in source for dir.
func NewPlugged(dir string, delay time.Duration, trustDomain string, auth *Authority, notify Notifier, log hclog.Logger, clk clock.Clock) *Plugged {
	return &Plugged{dir: dir, delay: delay, trustDomain: trustDomain, auth: auth, log: log, clk: clk, ann: newAnnouncer(notify, log, clk)}
}

func (p *Plugged) now() time.Time { return p.clk.Now() }

// Start loads the directory; invalid material is an error. Material that does not
// chain to the roots kept from the last installed material (Keeper) is refused as
// a reload would refuse it (unless ForceRootChange): nothing is installed, the
// signer answers unavailable, and Run installs the directory once it holds
// material the fleet trusts again (the files put back).
func (p *Plugged) Start(ctx context.Context) error {
	m, err := p.load()
	if err != nil {
		return fmt.Errorf("load %s: %w", p.dir, err)
	}
	if p.Keeper != nil {
		if p.kept, err = p.Keeper.Kept(ctx); err != nil {
			return fmt.Errorf("load %s: kept roots: %w", p.dir, err)
		}
	}
	if len(p.kept) > 0 {
		if err := continuousFrom(p.kept, m, p.now()); err != nil {
			if !p.ForceRootChange {
				p.rejected.Add(1)
				p.log.Error("cacerts refused at start-up: nothing installed until the directory holds material the fleet trusts", "dir", p.dir, "error", err)
				return nil
			}
			p.log.Warn("cacerts installed at start-up although pods trusting the kept roots will refuse it (-cacerts-force-root-change)", "dir", p.dir, "error", err)
		}
	}
	if err := m.endorse(p.trustDomain); err != nil {
		return fmt.Errorf("load %s: endorse bundle: %w", p.dir, err)
	}
	p.auth.install(m, true)
	p.keep(ctx, m)
	p.ann.settle(m.Generation)
	p.log.Info("ca material loaded", "dir", p.dir, "ca", m.Cert.Subject.String(), "root", m.RootFingerprint(), "not_after", m.NotAfter())
	return nil
}

// keep records m's roots as the ones the fleet trusts; a failure is logged (the
// next install writes again).
func (p *Plugged) keep(ctx context.Context, m *Material) {
	if p.Keeper == nil {
		return
	}
	p.kept = m.Roots
	if err := p.Keeper.Keep(ctx, m.Roots); err != nil {
		p.log.Warn("cannot keep the installed roots", "error", err)
	}
}

// Rotate is not supported: the operator owns plugged-in material.
func (p *Plugged) Rotate(context.Context, bool) (*Material, error) { return nil, ErrNotSupported }

// RotationPlan: none, as Rotate.
func (p *Plugged) RotationPlan(context.Context, bool, bool) (*events.RotationPlan, error) {
	return nil, ErrNotSupported
}

// Announced is the highest generation known to be announced with trust.changed (or
// to need no announcement: the one loaded at Start).
func (p *Plugged) Announced() uint64 { return p.ann.announced() }

// AnnounceFailures counts failed attempts to publish trust.changed (each is retried).
func (p *Plugged) AnnounceFailures() uint64 { return p.ann.failures.Load() }

// Run watches the directory (fsnotify, debounced) and reloads on change, and
// announces each change (retrying until the bus takes it), until ctx is done.
func (p *Plugged) Run(ctx context.Context) error {
	actx, stopAnnounce := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() { defer close(announced); p.ann.run(actx) }()
	defer func() { stopAnnounce(); <-announced }()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", p.dir, err)
	}
	defer w.Close()
	if err := w.Add(p.dir); err != nil {
		return fmt.Errorf("watch %s: %w", p.dir, err)
	}
	p.Reload(ctx) // catch a change made between Start and the watch
	var fire <-chan time.Time
	var timer clock.Timer
	for {
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			p.log.Debug("cacerts dir changed", "file", ev.Name, "op", ev.Op.String())
			if timer != nil {
				timer.Stop()
			}
			timer = p.clk.NewTimer(p.delay)
			fire = timer.C()
		case err, ok := <-w.Errors:
			if ok {
				p.log.Warn("cacerts watch error", "error", err)
			}
		case <-fire:
			fire = nil
			p.Reload(ctx)
		}
	}
}

// Reload reads the directory again. Invalid material is logged and ignored; a change
// is installed and queued for announcement with trust.changed (Run publishes it).
// It reports whether it installed.
func (p *Plugged) Reload(ctx context.Context) bool {
	m, err := p.load()
	if err != nil {
		p.rejected.Add(1)
		p.log.Error("cacerts reload rejected, keeping the current material", "dir", p.dir, "error", err)
		return false
	}
	old := p.auth.Current()
	if old != nil && sameMaterial(old, m) {
		return false
	}
	trusted := p.kept
	if old != nil {
		trusted = old.Roots
	}
	if len(trusted) > 0 {
		if err := continuousFrom(trusted, m, p.now()); err != nil {
			if !p.ForceRootChange {
				p.rejected.Add(1)
				p.log.Error("cacerts reload refused, keeping the current material", "dir", p.dir, "error", err)
				return false
			}
			p.log.Warn("cacerts reload installed although pods trusting the current roots will refuse it (-cacerts-force-root-change)", "dir", p.dir, "error", err)
		}
	}
	if old != nil && m.Generation <= old.Generation {
		m.Generation = old.Generation + 1
	}
	if err := m.endorse(p.trustDomain); err != nil {
		p.rejected.Add(1)
		p.log.Error("cacerts reload rejected, keeping the current material", "dir", p.dir, "error", err)
		return false
	}
	p.auth.install(m, true)
	p.keep(ctx, m)
	added, removed := diff(old, m)
	p.log.Info("ca material reloaded", "ca", m.Cert.Subject.String(), "root", m.RootFingerprint(), "added", len(added), "removed", len(removed))
	p.ann.observe(events.TrustChanged{TrustDomain: p.trustDomain, Roots: m.RootPEMs(), Added: added, Removed: removed,
		Reason: events.TrustReasonReload, Generation: m.Generation, Endorsements: m.Endorsements()})
	return true
}

func sameMaterial(a, b *Material) bool {
	return slices.Equal(a.ChainPEMs(), b.ChainPEMs()) && slices.Equal(a.RootPEMs(), b.RootPEMs())
}
