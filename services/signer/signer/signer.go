// Package signer is meshagent's CA as a service on the one lifecycle (pkg/lifecycle):
// Load reads its config, New builds a replica on a bus connection (CA material,
// plugged-in or self-signed; authentication; the issuer; the NATS and gRPC front
// ends; the bus auth callout) and Run starts, serves and stops it. Build is in
// this file, the CA source and its announcements in source.go, start-up and stop
// in start.go, how callers are authenticated in auth.go.
package signer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"

	"net/url"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/signer/internal/buscallout"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/federation"
	"github.com/meshagent/meshagent/services/signer/internal/grpcapi"
	"github.com/meshagent/meshagent/services/signer/internal/issued"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
	"github.com/meshagent/meshagent/services/signer/internal/kubecsr"
	"github.com/meshagent/meshagent/services/signer/internal/natsapi"
	"github.com/meshagent/meshagent/services/signer/internal/rootcm"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is the signer's whole configuration (flags and env vars: Load).
type Config = config.Config

// Load reads the signer's flags and env vars over its defaults and validates them.
func Load(args []string, getenv func(string) string) (Config, error) {
	return config.Load(args, getenv)
}

// source is where CA material comes from.
type source interface {
	// Start loads the material; the signer is not ready before it returns nil.
	Start(ctx context.Context) error
	// Run keeps the material current until ctx is done.
	Run(ctx context.Context) error
	// Rotate forces a root rotation.
	Rotate(ctx context.Context, newKey bool) (*ca.Material, error)
	// RotationPlan is the schedule of the current rotation, or of the one Rotate would make (dryRun).
	RotationPlan(ctx context.Context, newKey, dryRun bool) (*events.RotationPlan, error)
	// Announced is the highest bundle generation known to be announced.
	Announced() uint64
	// AnnounceFailures counts failed trust.changed publish attempts (all retried).
	AnnounceFailures() uint64
}

var (
	_ source = (*ca.SelfSigned)(nil)
	_ source = (*ca.Plugged)(nil)
)

// Signer is one signer replica.
type Signer struct {
	cfg    config.Config
	log    hclog.Logger
	clk    clock.Clock
	js     jetstream.JetStream
	auth   *ca.Authority
	source source
	keys   *authn.KeySet // nil unless tokens are verified against a JWKS
	iss    *issuer.Issuer
	// issued records which pod each certificate was issued to (for the callout).
	issued *issued.Store
	// callout admits pods to the bus (nil unless -bus-callout-seed is set).
	callout *buscallout.Responder
	nats    *natsapi.API
	grpc    *grpcapi.Server
	quorum  *bus.QuorumWatch    // the replication of the streams and buckets it writes
	fed     *federation.Service // the SPIFFE bundle endpoint and the follower of foreign bundles
	// rootCM publishes the trust bundle into every namespace (nil unless -root-configmap).
	rootCM *rootcm.Publisher
	// ra has an external signer sign every leaf (nil unless -external-ca).
	ra *kubecsr.RA
}

var _ lifecycle.Service = (*Signer)(nil)

// New builds a signer replica on d.Bus, telling time by d.Clock; it registers its
// metrics on d.Metrics and its readiness (CA loaded, NATS subscribed, gRPC bound,
// bus callout connected) on d.Health. Nothing listens, subscribes or runs until Run.
func New(cfg Config, d lifecycle.Deps) (*Signer, error) {
	if d.Bus == nil {
		return nil, errors.New("signer: no bus connection")
	}
	d = d.WithDefaults()
	js, err := jetstream.New(d.Bus)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	s := &Signer{cfg: cfg, log: d.Log, clk: d.Clock, js: js, auth: &ca.Authority{}, issued: issued.New(js, cfg.CA.KVReplicas, d.Log.Named("issued"))}
	counter := func(name, help string, value func() uint64) {
		d.Metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "meshagent", Subsystem: "signer", Name: name, Help: help,
		}, func() float64 { return float64(value()) }))
	}
	if s.ra, err = newRA(cfg, d.Log.Named("ra"), d.Clock); err != nil {
		return nil, err
	}
	if err := s.newSource(counter, d.Clock); err != nil {
		return nil, err
	}
	counter("trust_changed_publish_failures_total",
		"Failed attempts to publish trust.changed; each is retried until JetStream takes it.", s.source.AnnounceFailures)
	verifier, err := s.newVerifier(d.Clock)
	if err != nil {
		return nil, err
	}
	if cfg.BusCallout.IssuerSeed != "" {
		if err := s.newCallout(verifier, d.Metrics, d.Clock); err != nil {
			return nil, err
		}
		d.Health.AddReadyCheck("bus_callout", s.callout.Ready)
	}
	var tokens issuer.TokenVerifier
	if verifier != nil {
		tokens = verifier
	}
	nodes, err := s.newNodeAuthorizer()
	if err != nil {
		return nil, err
	}
	metrics := issuer.NewMetrics(d.Metrics, s.auth, d.Clock)
	publish := func(ctx context.Context, msg *nats.Msg) error { return bus.Publish(ctx, js, msg) }
	var lives issuer.LifeRecorder
	if ss, ok := s.source.(*ca.SelfSigned); ok {
		lives = ss // the phases of a rotation follow the leaves actually issued
	}
	icfg := issuer.Config{
		TrustDomain: cfg.TrustDomain, Instance: cfg.Instance, DefaultTTL: cfg.Certs.DefaultTTL,
		MaxTTL: cfg.Certs.MaxTTL, PodMaxTTL: cmp.Or(cfg.Certs.PodMaxTTL, cfg.Certs.DefaultTTL), Signers: cfg.Certs.Signers, Nodes: nodes,
		Named:   ca.NewNamedSigners(cfg.Certs.SignersDir, cfg.Certs.Signers),
		Records: s.issued, Lives: lives, MaxEarlyPerMinute: cfg.Certs.MaxEarlyPerMinute,
	}
	if s.ra != nil {
		icfg.External = s.ra
	}
	s.iss = issuer.New(icfg, s.auth, tokens, publish, metrics, d.Log.Named("issuer"), d.Clock)
	s.nats = natsapi.New(d.Bus, s.iss, s.auth, s.source, cfg.TrustDomain, cfg.Workers, cfg.BusCallout.SignByIdentity, d.Log.Named("nats"), d.Clock)
	counter("nats_requests_dropped_total",
		"NATS sign requests dropped unanswered because the subscription's pending bytes were full (slow consumer); callers retry.", s.nats.Dropped)
	counter("nats_requests_turned_away_total",
		fmt.Sprintf("NATS sign requests answered busy with a slot to ask again at (retry_after_ms), because the workers' queue (at most -workers x %d) would not reach them in time.", natsapi.PendingPerWorker), s.nats.TurnedAway)
	counter("nats_slow_consumer_events_total",
		"Slow-consumer errors on the signer's NATS subscriptions (each episode drops one or more requests).", s.nats.SlowConsumerEvents)
	counter("nats_late_replies_dropped_total",
		"Replies nats-server refused because the requester's response window had closed (a replica resuming from a freeze); logged at info.", bus.LateReplies)
	counter("nats_replies_refused_total",
		"NATS requests left unanswered because their reply subject was no inbox, or another requester's inbox than the one the subject proves.", s.nats.RefusedReplies)
	s.grpc = grpcapi.New(cfg.Listen.GRPC, s.iss, grpcapi.NewServingCerts(s.auth, cfg.Listen.DNSNames, cfg.Listen.IPs, d.Clock), d.Log.Named("grpc"))
	if err := s.newFederation(d.Metrics, d.Clock); err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	if err := s.newRootConfigMap(counter, d); err != nil {
		return nil, err
	}
	if s.quorum, err = bus.NewQuorumWatch(js, []string{events.StreamEvents, events.StreamPodEvents, "KV_" + cfg.CA.KVBucket, "KV_" + policy.BucketIssued},
		"signer", d.Metrics, d.Clock, d.Log.Named("quorum")); err != nil {
		return nil, err
	}
	d.Health.AddReadyCheck("ca", s.auth.Ready)
	d.Health.AddReadyCheck("nats", s.nats.Ready)
	d.Health.AddReadyCheck("grpc", s.grpc.Ready)
	return s, nil
}

// newRootConfigMap builds the publisher of the trust bundle into every namespace
// (-root-configmap), fed by every change of the CA material. It is not part of
// readiness: an API server outage must not stop signing.
func (s *Signer) newRootConfigMap(counter func(name, help string, value func() uint64), d lifecycle.Deps) error {
	rc := s.cfg.RootConfigMap
	if rc.Name == "" {
		return nil
	}
	p, err := rootcm.New(rootcm.Config{URL: rc.APIURL, CAFile: rc.CAFile, BearerFile: rc.BearerFile, Name: rc.Name, Key: rc.Key, Resync: rc.Resync},
		d.Log.Named("rootcm"), d.Clock)
	if err != nil {
		return err
	}
	s.auth.OnChange(func(_, cur *ca.Material) { p.SetBundle(cur.RootPEMs()) })
	counter("root_configmap_writes_total", "Root ConfigMaps (-root-configmap) created or corrected in a namespace.", p.Writes)
	counter("root_configmap_write_failures_total", "Writes of a root ConfigMap the API server refused or did not answer (retried).", p.Failures)
	s.rootCM = p
	return nil
}

// newFederation builds the signer's part in federation (internal/federation)
// and answers the followed domains' status in bundle replies.
func (s *Signer) newFederation(reg prometheus.Registerer, clk clock.Clock) error {
	f := s.cfg.Federation
	srcs, err := s.cfg.FederationSources()
	if err != nil {
		return err
	}
	fc := federation.ServiceConfig{TrustDomain: s.cfg.TrustDomain, Instance: s.cfg.Instance,
		Listen: f.Listen, CertFile: f.CertFile, KeyFile: f.KeyFile, SPIFFEID: f.SPIFFEID, RefreshHint: f.RefreshHint,
		Sources: srcs, CAFile: f.CAFile, Aliases: f.Aliases, MinRefresh: f.MinRefresh, MaxRefresh: f.MaxRefresh, MaxBundleSize: f.MaxBundleSize}
	if f.SPIFFEID != "" {
		id, err := url.Parse(f.SPIFFEID)
		if err != nil {
			return fmt.Errorf("bundle endpoint: %w", err)
		}
		fc.SVID = grpcapi.NewSVIDServingCerts(s.auth, id, clk).Get
	}
	if s.fed, err = federation.NewService(fc, s.auth, s.js, reg, s.log, clk); err != nil {
		return err
	}
	s.nats.SetFederationStatus(s.fed.Status)
	return nil
}

// GRPCAddr is the bound address of the Istio CA gRPC API, nil before Run binds it.
func (s *Signer) GRPCAddr() net.Addr { return s.grpc.Addr() }

// BundleEndpointAddr is the bound address of the SPIFFE bundle endpoint, nil
// before Run binds it or when it is not served.
func (s *Signer) BundleEndpointAddr() net.Addr { return s.fed.Addr() }

func (s *Signer) mode() string {
	m := "self-signed"
	if s.cfg.CA.Dir != "" {
		m = "plugged-in"
	}
	if s.ra != nil {
		m += ", registration authority for " + s.ra.SignerName()
	}
	return m
}
