// Package tlsrefresh keeps the relay's upstream TLS configuration current: it has
// the dialer rebuild it on trust.changed from the bus, when an endorsement of the
// bundle verifies under a root the pod trusts (pkg/trustbundle's check, as sds-edge
// makes it), and whenever sds-edge pushes a new ROOTCA or workload certificate.
package tlsrefresh

import (
	"context"
	"crypto/x509"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/nats-io/nats.go"
)

// Rebuilder is the upstream dialer's side.
type Rebuilder interface {
	Rebuild(reason string) error
	TrustChanged(generation uint64, roots []*x509.Certificate) error
}

// Changes is sds-edge's side (sdsclient.Watcher implements it).
type Changes interface {
	Changed() <-chan struct{}
}

// Trusted is what the pod trusts now: sds-edge's ROOTCA (sdsclient.Watcher
// implements it).
type Trusted interface {
	RootsPEM() ([]byte, error)
}

// Refresher has the dialer rebuild its TLS configuration on every change.
type Refresher struct {
	nc      *nats.Conn
	r       Rebuilder
	sds     Changes // nil: no sds-edge material
	trusted Trusted // nil: a pinned root CA file, which trust.changed does not change
	log     hclog.Logger

	accepted []*x509.Certificate // the roots of the last trust.changed taken
}

// New returns a Refresher; it subscribes in Run. trusted is nil when the relay
// trusts a root CA file of its own: trust.changed then only has it re-read.
func New(nc *nats.Conn, r Rebuilder, sds Changes, trusted Trusted, log hclog.Logger) *Refresher {
	return &Refresher{nc: nc, r: r, sds: sds, trusted: trusted, log: log}
}

// Run refreshes until ctx ends and returns nil then.
func (f *Refresher) Run(ctx context.Context) error {
	ch := make(chan *nats.Msg, 16)
	sub, err := f.nc.ChanSubscribe(events.SubjectTrustChanged, ch)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", events.SubjectTrustChanged, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	var changed <-chan struct{}
	if f.sds != nil {
		changed = f.sds.Changed()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-ch:
			f.onTrustChanged(msg)
		case <-changed:
			changed = f.sds.Changed()
			if err := f.r.Rebuild("sds-edge update"); err != nil {
				f.log.Warn("cannot rebuild upstream tls", "error", err)
			}
		}
	}
}

func (f *Refresher) onTrustChanged(msg *nats.Msg) {
	ev, _, err := events.Decode[events.TrustChanged](msg)
	if err != nil {
		f.log.Warn("ignoring bad trust.changed", "error", err)
		return
	}
	roots, err := f.check(ev)
	if err != nil {
		f.log.Warn("ignoring trust.changed", "generation", ev.Generation, "error", err)
		return
	}
	if err := f.r.TrustChanged(ev.Generation, roots); err != nil {
		f.log.Warn("cannot rebuild upstream tls", "generation", ev.Generation, "error", err)
		return
	}
	f.accepted = roots
	f.log.Info("upstream tls rebuilt on trust change", "generation", ev.Generation, "roots", len(roots))
}

// check returns the roots of ev when one of its endorsements verifies under a root
// the pod trusts now (sds-edge's ROOTCA, or the last bundle taken): a bus client
// without a CA key cannot make the relay trust its root. Without sds-edge material
// the relay's roots are a file of its own, and ev's roots are not used.
func (f *Refresher) check(ev events.TrustChanged) ([]*x509.Certificate, error) {
	if f.trusted == nil {
		return pki.ParseCertPEMs(ev.Roots)
	}
	trusted := append([]*x509.Certificate(nil), f.accepted...)
	if pemBytes, err := f.trusted.RootsPEM(); err == nil {
		own, err := pki.ParseCertsPEM(pemBytes)
		if err != nil {
			return nil, fmt.Errorf("sds-edge roots: %w", err)
		}
		trusted = append(trusted, own...)
	}
	return trustbundle.CheckUnder("", trusted, trustbundle.FromTrustChanged(ev))
}
