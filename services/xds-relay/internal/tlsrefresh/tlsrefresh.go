// Package tlsrefresh keeps the relay's upstream TLS configuration current: it has
// the dialer rebuild it on trust.changed from the bus and whenever sds-edge pushes
// a new ROOTCA or workload certificate.
package tlsrefresh

import (
	"context"
	"crypto/x509"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
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

// Refresher has the dialer rebuild its TLS configuration on every change.
type Refresher struct {
	nc  *nats.Conn
	r   Rebuilder
	sds Changes // nil: no sds-edge material
	log hclog.Logger
}

// New returns a Refresher; it subscribes in Run.
func New(nc *nats.Conn, r Rebuilder, sds Changes, log hclog.Logger) *Refresher {
	return &Refresher{nc: nc, r: r, sds: sds, log: log}
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
	roots, err := pki.ParseCertPEMs(ev.Roots)
	if err != nil {
		f.log.Warn("ignoring trust.changed with bad roots", "generation", ev.Generation, "error", err)
		return
	}
	if err := f.r.TrustChanged(ev.Generation, roots); err != nil {
		f.log.Warn("cannot rebuild upstream tls", "generation", ev.Generation, "error", err)
		return
	}
	f.log.Info("upstream tls rebuilt on trust change", "generation", ev.Generation, "roots", len(roots))
}
