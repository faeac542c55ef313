// Package edge wires sds-edge together: the start-up decision, the CA flow or the
// file loader, the SDS listener, the bus and the health checks.
package edge

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/outbox"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/busio"
	"github.com/meshagent/meshagent/services/sds-edge/internal/ca"
	"github.com/meshagent/meshagent/services/sds-edge/internal/config"
	"github.com/meshagent/meshagent/services/sds-edge/internal/filecerts"
	"github.com/meshagent/meshagent/services/sds-edge/internal/identity"
	"github.com/meshagent/meshagent/services/sds-edge/internal/metrics"
	"github.com/meshagent/meshagent/services/sds-edge/internal/output"
	"github.com/meshagent/meshagent/services/sds-edge/internal/sds"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
	"github.com/meshagent/meshagent/services/sds-edge/internal/startup"
)

// Deps are the runtime dependencies.
type Deps struct {
	NC    *nats.Conn
	JS    jetstream.JetStream
	Clock clock.Clock
	Log   hclog.Logger
	// Registry gets the metrics; nil: a private registry.
	Registry prometheus.Registerer
	// Signer overrides the CA client (tests); nil picks NATS or gRPC from the config.
	Signer ca.Signer
}

// Edge is one pod's sds-edge.
type Edge struct {
	cfg      config.Config
	spiffeID string
	d        Deps
	log      hclog.Logger
	store    *secrets.Store
	pub      *outbox.Outbox
	files    *filecerts.Files
	out      *output.Writer

	m *metrics.Metrics

	mode      atomic.Value // string
	bound     chan struct{}
	readyOnce sync.Once
}

// New builds an Edge. It does not listen or start anything until Run.
func New(cfg config.Config, d Deps) (*Edge, error) {
	id, err := cfg.SPIFFEID()
	if err != nil {
		return nil, err
	}
	if d.Clock == nil {
		d.Clock = clock.Real{}
	}
	if d.Log == nil {
		d.Log = hclog.NewNullLogger()
	}
	store := secrets.New(nil)
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	e := &Edge{cfg: cfg, spiffeID: id, d: d, log: d.Log, store: store, bound: make(chan struct{}),
		m: metrics.New(d.Registry, store, d.Clock.Now)}
	// pod.down is queued last, at shutdown: give it 3s to reach the bus.
	if e.pub, err = outbox.New(d.JS, outbox.Options{Source: "sds-edge/" + cfg.Pod.ID, Size: 4096, Flush: 3 * time.Second,
		Metric: metrics.EventsDropped, Registry: d.Registry, Log: d.Log.Named("events")}); err != nil {
		return nil, err
	}
	e.files = filecerts.New(store, cfg.Under, cfg.Cert.FileDebounce, e.Changed, d.Log.Named("files"))
	store.SetResolver(e.files)
	if cfg.Cert.OutputDir != "" {
		e.out = output.New(cfg.Cert.OutputDir)
	}
	return e, nil
}

// Store is the secret store (for metrics).
func (e *Edge) Store() *secrets.Store { return e.store }

// Mode is the start-up decision, "" before it is made.
func (e *Edge) Mode() string { m, _ := e.mode.Load().(string); return m }

// Bound is closed when the SDS socket accepts connections (or external mode is chosen).
func (e *Edge) Bound() <-chan struct{} { return e.bound }

// Ready is the readiness check: the socket bound with `default` and `ROOTCA` in
// hand, or external mode.
func (e *Edge) Ready() error {
	switch e.Mode() {
	case "":
		return errors.New("starting")
	case startup.External:
		return nil
	}
	select {
	case <-e.bound:
	default:
		return errors.New("sds socket not bound yet")
	}
	var missing []error
	for _, n := range []string{secrets.Default, secrets.RootCA} {
		if _, ok := e.store.Get(n); !ok {
			missing = append(missing, fmt.Errorf("%s not available yet", n))
		}
	}
	return errors.Join(missing...)
}

// Run decides the mode and serves until ctx ends. It returns nil on cancellation.
func (e *Edge) Run(ctx context.Context) error {
	pubCtx, stopPub := context.WithCancel(context.Background())
	pubDone := make(chan struct{})
	go func() { _ = e.pub.Run(pubCtx); close(pubDone) }()
	defer func() { stopPub(); <-pubDone }()

	dec, err := startup.Decide(ctx, startup.Options{Socket: e.cfg.SDS.Socket, ExternalWait: e.cfg.SDS.ExternalWait,
		CredentialsDir: e.cfg.Cert.CredentialsDir, FileMounted: e.cfg.Cert.FileMounted, FileMountedDir: e.cfg.Cert.FileMountedDir},
		e.log.Named("startup"))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	e.mode.Store(dec.Mode)
	e.log.Info("identity mode chosen", "mode", dec.Mode, "spiffe_id", e.spiffeID, "socket", e.cfg.SDS.Socket)
	e.publish(events.PodEventUp, events.PodUp{Pod: e.cfg.Pod.ID, SPIFFEID: e.spiffeID, Mode: dec.Mode, Socket: e.cfg.SDS.Socket})
	defer e.publish(events.PodEventDown, events.PodDown{Pod: e.cfg.Pod.ID, Reason: "shutdown"})

	if dec.Mode == startup.External {
		close(e.bound)
		e.log.Info("ready: another sds server owns the socket", "socket", e.cfg.SDS.Socket)
		<-ctx.Done()
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	switch dec.Mode {
	case startup.File:
		if err := e.files.Mount(dec.Dir); err != nil {
			return fmt.Errorf("mounted certificates in %s: %w", dec.Dir, err)
		}
	case startup.CA:
		mgr, closeSigner, err := e.manager()
		if err != nil {
			return err
		}
		defer closeSigner()
		unsub, err := busio.Subscribe(e.d.NC, e.cfg.Pod.ID, busio.Handlers{
			Renew: mgr.Renew, Trust: mgr.TrustChanged, Anchors: mgr.SetAnchors}, e.log.Named("bus"))
		if err != nil {
			return err
		}
		defer unsub()
		// trust.changed is not durable for us: after a bus outage, ask for the bundle.
		busio.OnReconnect(e.d.NC, func() { go e.refreshBundle(gctx, mgr) })
		g.Go(func() error { return mgr.Run(gctx) })
	}
	ln := sds.NewListener(e.cfg.SDS.Socket, e.cfg.SDS.SocketMode, sds.New(e.store, hooks{e}, e.log.Named("sds")), e.log.Named("sds"))
	g.Go(func() error { return ln.Run(gctx) })
	g.Go(func() error { return e.files.Run(gctx) })
	g.Go(func() error {
		select {
		case <-ln.Bound():
			close(e.bound)
			e.logReady()
		case <-gctx.Done():
		}
		return nil
	})
	err = g.Wait()
	e.log.Info("stopped", "error", err)
	return err
}

// manager builds the CA flow with the NATS or the gRPC client; closeSigner
// releases a client it made (the gRPC connection), once the manager has stopped.
func (e *Edge) manager() (mgr *identity.Manager, closeSigner func(), err error) {
	c := e.cfg
	var seed []*x509.Certificate
	if c.CA.RootCert != "" {
		data, err := os.ReadFile(c.CA.RootCert)
		if err != nil {
			return nil, nil, fmt.Errorf("-ca-root-cert: %w", err)
		}
		if seed, err = pki.ParseCertsPEM(data); err != nil || len(seed) == 0 {
			return nil, nil, fmt.Errorf("-ca-root-cert: %s holds no certificates: %v", c.CA.RootCert, err)
		}
	}
	var anchors []*x509.Certificate
	if c.CA.TrustAnchorsFile != "" {
		data, err := os.ReadFile(c.CA.TrustAnchorsFile)
		if err != nil {
			return nil, nil, fmt.Errorf("-trust-anchors-file: %w", err)
		}
		if anchors, err = pki.ParseCertsPEM(data); err != nil || len(anchors) == 0 {
			return nil, nil, fmt.Errorf("-trust-anchors-file: %s holds no certificates: %v", c.CA.TrustAnchorsFile, err)
		}
	}
	closeSigner = func() {}
	signer := e.d.Signer
	if signer == nil {
		if c.CA.Addr != "" {
			istio := ca.NewIstio(c.CA.Addr, c.CA.ClusterID, c.CA.Plaintext, func() *x509.CertPool {
				if len(seed) > 0 {
					p := x509.NewCertPool()
					for _, r := range seed {
						p.AddCert(r)
					}
					return p
				}
				return mgr.Roots()
			})
			signer, closeSigner = istio, func() { _ = istio.Close() }
		} else {
			signer = ca.NewNATS(e.d.NC, "sds-edge/"+c.Pod.ID)
		}
	}
	mgr = identity.New(identity.Config{Pod: c.Pod.ID, SPIFFEID: e.spiffeID, TrustDomain: c.Pod.TrustDomain, TokenFile: c.CA.TokenFile, TTL: c.Cert.TTL,
		KeyAlg: c.Cert.KeyAlg, PKCS8: c.Cert.PKCS8, SafetyRatio: c.Cert.SafetyRatio, RetryMin: c.Cert.RetryMin,
		RetryMax: c.Cert.RetryMax, RequestTimeout: c.Cert.RequestTimeout, Anchors: anchors}, signer, e.store, sink{e}, e.d.Clock, e.log.Named("identity"))
	return mgr, closeSigner, nil
}

// Changed publishes a change of a resource and counts the push.
func (e *Edge) Changed(en *secrets.Entry, streams int) {
	e.logReady()
	e.m.Pushes.WithLabelValues(en.Name).Add(float64(streams))
	e.publish(events.PodEventSecretPushed, events.SecretPushed{Pod: e.cfg.Pod.ID, Resource: en.Name, Serial: en.Serial,
		Version: en.Version, Streams: streams, Kind: "pushed"})
}

// logReady logs readiness once, when it is reached.
func (e *Edge) logReady() {
	if e.Ready() == nil {
		e.readyOnce.Do(func() { e.log.Info("ready: default and ROOTCA in hand", "socket", e.cfg.SDS.Socket) })
	}
}

// refreshBundle applies the signer's current bundle, as if trust.changed had come
// (checked the same way).
func (e *Edge) refreshBundle(ctx context.Context, mgr *identity.Manager) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Cert.RequestTimeout)
	defer cancel()
	r, err := trustbundle.Fetch(ctx, e.d.NC, "sds-edge/"+e.cfg.Pod.ID)
	if err == nil {
		if r.TrustDomain == "" {
			r.TrustDomain = e.cfg.Pod.TrustDomain
		}
		err = mgr.ApplyBundle(identity.SourceBundle, trustbundle.FromBundleReply(r))
	}
	if err != nil {
		e.log.Warn("cannot refresh the trust bundle after reconnecting", "error", err)
		return
	}
	e.log.Info("trust bundle refreshed after reconnecting", "roots", len(r.Roots), "generation", r.Generation)
}

// publish queues one of the pod's events (kind: events.PodEvent*) on its pod subject.
func (e *Edge) publish(kind string, p events.Payload) {
	subject, err := events.PodEventSubject(e.cfg.Pod.ID, kind)
	if err != nil {
		e.log.Warn("dropping event", "kind", kind, "error", err)
		return
	}
	e.pub.Publish(subject, p)
}
