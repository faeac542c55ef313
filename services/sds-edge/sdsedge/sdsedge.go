// Package sdsedge is sds-edge as a service of the one lifecycle (pkg/lifecycle):
// Load its config, New to build it on the bus connection, Run to serve. It chooses
// how the pod gets its identity (another provider's socket, mounted files, or the
// CA flow), serves `default` and `ROOTCA` over SDS on a unix socket, and publishes
// what it does on the pod's event subjects.
package sdsedge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/outbox"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/caclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/clientcert"
	"github.com/meshagent/meshagent/services/sds-edge/internal/config"
	"github.com/meshagent/meshagent/services/sds-edge/internal/filecerts"
	"github.com/meshagent/meshagent/services/sds-edge/internal/identity"
	"github.com/meshagent/meshagent/services/sds-edge/internal/identitymode"
	"github.com/meshagent/meshagent/services/sds-edge/internal/metrics"
	"github.com/meshagent/meshagent/services/sds-edge/internal/podfeed"
	"github.com/meshagent/meshagent/services/sds-edge/internal/sds"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// Config is sds-edge's configuration: flags, env vars and defaults (see Load).
type Config = config.Config

// Load reads the config from flags, then env vars, then defaults, and validates it.
func Load(args []string, getenv func(string) string) (Config, error) {
	return config.Load(args, getenv)
}

// Edge is one pod's sds-edge.
type Edge struct {
	cfg      Config
	spiffeID string
	d        lifecycle.Deps
	log      hclog.Logger
	store    *secrets.Store
	pub      *outbox.Outbox
	files    *filecerts.Files
	// gateway serves gateway credentials on their own socket (nil: off).
	gateway *gatewayServer

	m *metrics.Metrics

	mode      atomic.Value // string
	bound     chan struct{}
	readyOnce sync.Once
	// reconnected wakes the task that fetches the trust bundle after a bus outage.
	reconnected chan struct{}
	// ca is the CA flow and closeCA releases the client it signs with (the gRPC
	// connection); built in New, run only when the start-up decision is the CA flow.
	ca      *identity.Manager
	closeCA func()
	// rootsHeld wakes the task that reads the foreign domains' last
	// announcements once the pod holds its own roots (they are checked by them).
	rootsHeld chan struct{}
	// mgr is the CA flow, once chosen (nil in the other modes).
	mgr atomic.Pointer[identity.Manager]
	// certWake wakes watchExpiry when the CA flow's status changed.
	certWake chan struct{}
}

// New builds an Edge on d.Bus, registering its metrics on d.Metrics and its
// readiness check on d.Health. It neither listens nor starts anything until Run.
func New(cfg Config, d lifecycle.Deps) (*Edge, error) {
	d = d.WithDefaults()
	id, err := cfg.SPIFFEID()
	if err != nil {
		return nil, err
	}
	if d.Bus == nil {
		return nil, errors.New("sds-edge needs a bus connection")
	}
	js, err := jetstream.New(d.Bus)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	store := secrets.New(nil)
	e := &Edge{cfg: cfg, spiffeID: id, d: d, log: d.Log, store: store, bound: make(chan struct{}),
		m: metrics.New(d.Metrics, store, d.Clock), reconnected: make(chan struct{}, 1), rootsHeld: make(chan struct{}, 1), certWake: make(chan struct{}, 1)}
	// pod.down is queued last, at shutdown: give it 3s to reach the bus.
	if e.pub, err = outbox.New(js, outbox.Options{Source: "sds-edge/" + cfg.PodRef().String(), Size: 4096, Flush: 3 * time.Second,
		Metric: metrics.EventsDropped, Registry: d.Metrics, Log: d.Log.Named("events")}); err != nil {
		return nil, err
	}
	e.files = filecerts.New(store, cfg.Pod.Path, cfg.Cert.FileCertDirs, cfg.Cert.FileDebounce, e.Changed, d.Clock, d.Log.Named("files"))
	store.SetResolver(e.files)
	if cfg.Gateway.Dir != "" {
		if e.gateway, err = newGatewayServer(e); err != nil {
			return nil, err
		}
	}
	if e.ca, e.closeCA, err = e.manager(); err != nil {
		return nil, err
	}
	d.Health.AddReadyCheck("secrets", e.Ready)
	return e, nil
}

// Store is the secret store (for metrics).
func (e *Edge) Store() *secrets.Store { return e.store }

// Mode is the start-up decision, "" before it is made.
func (e *Edge) Mode() string { m, _ := e.mode.Load().(string); return m }

// Bound is closed when the SDS socket accepts connections (or external mode is chosen).
func (e *Edge) Bound() <-chan struct{} { return e.bound }

// Ready is the readiness check: the socket bound with `default` and `ROOTCA` in
// hand, and `default` neither expired nor expiring with its renewal failing
// (certHealth); or external mode.
func (e *Edge) Ready() error {
	switch e.Mode() {
	case "":
		return errors.New("starting")
	case identitymode.External:
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
	if len(missing) > 0 {
		return errors.Join(missing...)
	}
	return e.certHealth()
}

// Run decides the mode and serves until ctx ends. It returns nil on cancellation.
// The event outbox outlives the serving task, so that pod.down, queued as that task
// stops, still reaches the bus.
func (e *Edge) Run(ctx context.Context) error {
	pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPub()
	tasks := []func(context.Context) error{
		func(ctx context.Context) error { defer stopPub(); return e.serve(ctx) },
		func(context.Context) error { return e.pub.Run(pubCtx) }}
	if e.gateway != nil {
		tasks = append(tasks, e.gateway.run)
	}
	return lifecycle.Tasks(ctx, tasks...)
}

// serve decides the mode, announces the pod, and runs what the mode needs until
// ctx ends.
func (e *Edge) serve(ctx context.Context) error {
	dec, err := identitymode.Decide(ctx, identitymode.Options{Socket: e.cfg.SDS.Socket, ExternalWait: e.cfg.SDS.ExternalWait,
		CredentialsDir: e.cfg.Cert.CredentialsDir, FileMounted: e.cfg.Cert.FileMounted, FileMountedDir: e.cfg.Cert.FileMountedDir},
		e.d.Clock, e.log.Named("startup"))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	e.mode.Store(dec.Mode)
	e.log.Info("identity mode chosen", "mode", dec.Mode, "spiffe_id", e.spiffeID, "socket", e.cfg.SDS.Socket)
	e.publish(events.PodEventUp, events.PodUp{Pod: e.cfg.PodRef(), SPIFFEID: e.spiffeID, Mode: dec.Mode, Socket: e.cfg.SDS.Socket})
	defer e.publish(events.PodEventDown, events.PodDown{Pod: e.cfg.PodRef(), Reason: "shutdown"})

	if dec.Mode == identitymode.External {
		close(e.bound)
		e.log.Info("ready: another sds server owns the socket", "socket", e.cfg.SDS.Socket)
		<-ctx.Done()
		return nil
	}
	ln := sds.NewListener(e.cfg.SDS.Socket, e.cfg.SDS.SocketMode, sds.New(e.store, sdsObserver{e}, e.d.Clock, e.log.Named("sds")), e.log.Named("sds"))
	tasks := []func(context.Context) error{ln.Run, e.files.Run, func(ctx context.Context) error {
		select {
		case <-ln.Bound():
			close(e.bound)
			e.logReady()
		case <-ctx.Done():
		}
		return nil
	}}
	switch dec.Mode {
	case identitymode.File:
		if err := e.files.Mount(dec.Dir); err != nil {
			return fmt.Errorf("mounted certificates in %s: %w", dec.Dir, err)
		}
	case identitymode.CA:
		mgr := e.ca
		defer e.closeCA()
		// From now on the bus and the gRPC CA are shown the pod's own certificate.
		e.cfg.ClientCert.Use(mgr.ClientCertificate, e.d.Clock)
		unsub, err := podfeed.Subscribe(e.d.Bus, e.cfg.PodRef(), podfeed.Handlers{
			Renew: mgr.Renew, Trust: mgr.TrustChanged, Federated: mgr.Federated, Anchors: mgr.SetAnchors}, e.log.Named("bus"))
		if err != nil {
			return err
		}
		defer unsub()
		// trust.changed is not durable for us: after a bus outage, ask for the bundle.
		podfeed.OnReconnect(e.d.Bus, func() {
			mgr.Reconnected()
			select {
			case e.reconnected <- struct{}{}:
			default: // a refresh is already due
			}
		})
		e.mgr.Store(mgr)
		tasks = append(tasks, mgr.Run, func(ctx context.Context) error { return e.refreshOnReconnect(ctx, mgr) },
			func(ctx context.Context) error { return e.catchUpFederated(ctx, mgr) },
			func(ctx context.Context) error { return e.watchExpiry(ctx, mgr) })
	}
	err = lifecycle.Tasks(ctx, tasks...)
	e.log.Info("stopped", "error", err)
	return err
}

// manager builds the CA flow with the NATS or the gRPC client, or both (the bus,
// and gRPC when the bus is unreachable: -ca-fallback-addr); closeSigner
// releases a client it made (the gRPC connection), once the manager has stopped.
// It reads the roots the pod is configured with and kept, and starts nothing.
func (e *Edge) manager() (mgr *identity.Manager, closeSigner func(), err error) {
	c := e.cfg
	seed, err := readRoots("-ca-root-cert", c.CA.RootCert)
	if err != nil {
		return nil, nil, err
	}
	anchors, kept, err := e.trustAnchors(seed)
	if err != nil {
		return nil, nil, err
	}
	closeSigner = func() {}
	// grpcCA is a client of the CA's Istio gRPC API at addr, verifying its TLS
	// with -ca-root-cert and the roots the pod trusts (which follow a rotation).
	grpcCA := func(addr string) *caclient.Istio {
		istio := caclient.NewIstio(addr, c.CA.ClusterID, strings.HasSuffix(addr, ":15010"), func() *x509.CertPool {
			if c.CA.SystemRoots {
				return systemRoots()
			}
			if len(seed) == 0 {
				return mgr.Roots()
			}
			p := mgr.Roots()
			if p == nil {
				p = x509.NewCertPool()
			}
			for _, r := range seed {
				p.AddCert(r)
			}
			return p
		})
		istio.SetClientCert(c.ClientCert.Get)
		closeSigner = func() { _ = istio.Close() }
		return istio
	}
	busCA := caclient.NewNATS(e.d.Bus, "sds-edge/"+c.PodRef().String())
	if c.Bus.TokenFile != "" || c.ClientCert.Provisioned() {
		// Admitted by the signer's auth callout with the pod's token or certificate:
		// sign on the identity subject it grants (the credential proves this
		// namespace and account).
		busCA = caclient.NewNATSAs(e.d.Bus, "sds-edge/"+c.PodRef().String(), c.Pod.ServiceAccount)
	}
	if c.CA.ViaNode != "" {
		// Admitted by its node agent: the node's sign subject, the token in the request.
		busCA = caclient.NewNATSVia(e.d.Bus, "sds-edge/"+c.PodRef().String(), c.CA.ViaNode)
	}
	var signer identity.Signer
	switch {
	case c.CA.Addr != "":
		signer = grpcCA(c.CA.Addr)
	case len(c.CA.FallbackAddrs) > 0:
		fb := caclient.Fallback{Bus: busCA}
		var closers []func()
		for _, a := range c.CA.FallbackAddrs {
			fb.GRPC = append(fb.GRPC, grpcCA(a))
			closers = append(closers, closeSigner)
		}
		closeSigner = func() {
			for _, c := range closers {
				c()
			}
		}
		signer = fb
	default:
		signer = busCA
	}
	mgr = identity.New(identity.Config{Pod: c.PodRef(), SPIFFEID: e.spiffeID, TrustDomain: c.Pod.TrustDomain, TrustDomainAliases: c.Pod.TrustDomainAliases, TokenFile: c.CA.TokenFile, TTL: c.Cert.TTL,
		KeyAlg: c.Cert.KeyAlg, PKCS8: c.Cert.PKCS8, SafetyRatio: c.Cert.SafetyRatio, GraceRatio: c.Cert.GraceRatio, RetryMin: c.Cert.RetryMin,
		RetryMax: c.Cert.RetryMax, RequestTimeout: c.Cert.RequestTimeout, Anchors: anchors, Kept: kept,
		TrustState: c.CA.TrustState, CertState: c.Cert.State, OutputDir: c.Cert.OutputDir,
		Provisioned: provisioned(c.CA.ProvCert, e.d.Clock), CertSigner: c.Cert.Signer}, signer, e.store, identityObserver{e}, e.d.Clock, e.log.Named("identity"))
	return mgr, closeSigner, nil
}

// trustAnchors are the roots the pod trusts before its first bundle: the
// -trust-anchors-file, else all of seed (-ca-root-cert), and the unexpired roots
// it trusted before a restart, which are also returned alone (kept).
func (e *Edge) trustAnchors(seed []*x509.Certificate) (anchors, kept []*x509.Certificate, err error) {
	anchors, err = readRoots("-trust-anchors-file", e.cfg.CA.TrustAnchorsFile)
	if err != nil {
		return nil, nil, err
	}
	if len(anchors) == 0 {
		// -ca-root-cert is the roots the pod trusts the CA by: all of them are the
		// pod's trust before its first bundle, not only the one a reply ends at.
		anchors = slices.Clone(seed)
	}
	// What the pod trusted before a restart stays trusted: no trust on first use again.
	stored, err := readRoots("trust state", e.cfg.CA.TrustState)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.Warn("ignoring the kept trusted roots", "path", e.cfg.CA.TrustState, "error", err)
	}
	for _, r := range stored {
		if !e.d.Clock.Now().Before(r.NotAfter) {
			continue
		}
		kept = append(kept, r)
		if !slices.ContainsFunc(anchors, r.Equal) {
			anchors = append(anchors, r)
		}
	}
	return anchors, kept, nil
}

// readRoots reads the PEM certificates in path (none for ""); flag names the
// setting in errors.
func readRoots(flag, path string) ([]*x509.Certificate, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	certs, err := pki.ParseCertsPEM(data)
	if err != nil || len(certs) == 0 {
		return nil, fmt.Errorf("%s: %s holds no certificates: %v", flag, path, err)
	}
	return certs, nil
}

// Changed publishes a change of a resource and counts the push.
func (e *Edge) Changed(en *secrets.Entry, streams int) {
	e.logReady()
	if en.Name == secrets.RootCA {
		select {
		case e.rootsHeld <- struct{}{}:
		default:
		}
	}
	e.m.Pushes.WithLabelValues(en.Name).Add(float64(streams))
	e.publish(events.PodEventSecretPushed, events.SecretPushed{Pod: e.cfg.PodRef(), Resource: en.Name, Serial: en.Serial,
		Version: en.Version, Streams: streams, Kind: "pushed"})
}

// logReady logs readiness once, when it is reached.
func (e *Edge) logReady() {
	if e.Ready() == nil {
		e.readyOnce.Do(func() { e.log.Info("ready: default and ROOTCA in hand", "socket", e.cfg.SDS.Socket) })
	}
}

// refreshOnReconnect refreshes the trust bundle each time the bus connection comes
// back, until ctx ends.
func (e *Edge) refreshOnReconnect(ctx context.Context, mgr *identity.Manager) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.reconnected:
			e.refreshBundle(ctx, mgr)
			e.fetchFederated(ctx, mgr) // announcements made while the bus was away
		}
	}
}

// catchUpFederated applies, once the pod first holds its roots, the last
// trust.federated of every foreign domain the CA's history keeps: a pod started
// after an announcement holds the foreign roots at once instead of at the
// signer's next refresh. Each is checked as a live one (mgr.Federated: endorsed
// by the home CA). A failed read is retried a few times, then left to the next
// live announcement.
func (e *Edge) catchUpFederated(ctx context.Context, mgr *identity.Manager) error {
	select {
	case <-ctx.Done():
		return nil
	case <-e.rootsHeld:
	}
	retry := federatedRetry.Start()
	for range federatedTries {
		if e.fetchFederated(ctx, mgr) || !backoff.Wait(ctx, e.d.Clock, retry.Next()) {
			return nil
		}
	}
	return nil
}

// federatedRetry and federatedTries bound catchUpFederated: five reads, 100ms
// apart doubling, about three seconds in all.
var federatedRetry = backoff.Policy{First: 100 * time.Millisecond, Max: 1600 * time.Millisecond}

const federatedTries = 5

// fetchFederated reads and applies the foreign domains' last announcements; it
// reports whether the read worked (an announcement refused is logged, not retried).
func (e *Edge) fetchFederated(ctx context.Context, mgr *identity.Manager) bool {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Cert.RequestTimeout)
	defer cancel()
	evs, err := trustbundle.FetchFederated(ctx, e.d.Bus, "sds-edge/"+e.cfg.PodRef().String())
	for _, ev := range evs {
		if aerr := mgr.Federated(ev); aerr != nil {
			e.log.Warn("refusing a foreign domain's last announcement", "trust_domain", ev.Foreign, "error", aerr)
		}
	}
	if err != nil {
		e.log.Warn("cannot read the foreign domains' last announcements", "error", err)
		return false
	}
	if len(evs) > 0 {
		e.log.Info("foreign trust domains read at start", "domains", len(evs))
	}
	return true
}

// refreshBundle applies the signer's current bundle, as if trust.changed had come
// (checked the same way).
func (e *Edge) refreshBundle(ctx context.Context, mgr *identity.Manager) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Cert.RequestTimeout)
	defer cancel()
	r, err := trustbundle.Fetch(ctx, e.d.Bus, "sds-edge/"+e.cfg.PodRef().String())
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
	subject, err := events.PodEventSubject(e.cfg.PodRef(), kind)
	if err != nil {
		e.log.Warn("dropping event", "kind", kind, "error", err)
		return
	}
	e.pub.Publish(subject, p)
}

// provisioned is the provisioned certificate in dir (PROV_CERT) while it is valid,
// what the CA flow proves itself with when it has neither a token nor a valid
// certificate of its own; nil without one.
func provisioned(dir string, clk clock.Clock) func() (*tls.Certificate, error) {
	if dir == "" {
		return nil
	}
	return func() (*tls.Certificate, error) { return clientcert.Load(dir, clk.Now()) }
}

// systemRoots is the host's trust store (nil, and the CA unreachable, without one).
func systemRoots() *x509.CertPool {
	p, err := x509.SystemCertPool()
	if err != nil {
		return nil
	}
	return p
}
