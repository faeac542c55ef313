// Package service wires the signer together: CA material (plugged-in or self-signed),
// authentication, the issuer, the NATS and gRPC front ends and the health/metrics
// server, and runs them until the context ends.
package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/services/signer/internal/authn"
	"github.com/meshagent/meshagent/services/signer/internal/buscallout"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/grpcapi"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
	"github.com/meshagent/meshagent/services/signer/internal/natsapi"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Source is where CA material comes from.
type Source interface {
	// Start loads the material; the signer is not ready before it returns nil.
	Start(ctx context.Context) error
	// Run keeps the material current until ctx is done.
	Run(ctx context.Context) error
	// Rotate forces a root rotation.
	Rotate(ctx context.Context, newKey bool) (*ca.Material, error)
	// Announced is the highest bundle generation known to be announced.
	Announced() uint64
	// AnnounceFailures counts failed trust.changed publish attempts (all retried).
	AnnounceFailures() uint64
}

var (
	_ Source = (*ca.SelfSigned)(nil)
	_ Source = (*ca.Plugged)(nil)
)

// Service is one signer replica.
type Service struct {
	cfg    config.Config
	log    hclog.Logger
	js     jetstream.JetStream
	auth   *ca.Authority
	source Source
	keys   *authn.KeySet
	iss    *issuer.Issuer
	// callout admits pods to the bus (nil unless -bus-callout-seed is set).
	callout *buscallout.Responder
	nats    *natsapi.API
	grpc    *grpcapi.Server
	http    *obs.Server
}

// New builds a signer on nc. now is the clock (time.Now when nil). Nothing listens
// or runs until Run.
func New(cfg config.Config, nc *nats.Conn, log hclog.Logger, now func() time.Time) (*Service, error) {
	if now == nil {
		now = time.Now
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	s := &Service{cfg: cfg, log: log, js: js, auth: &ca.Authority{}}
	s.http = obs.NewServer(cfg.Listen.HTTP, log.Named("http"))
	source := "meshagent/signer/" + cfg.Instance
	notify := func(ctx context.Context, tc events.TrustChanged) error {
		msg, err := events.Encode(events.SubjectTrustChanged, events.Meta{Source: source, ID: fmt.Sprintf("trust-%s-%d", cfg.TrustDomain, tc.Generation)}, tc)
		if err != nil {
			return err
		}
		return bus.Publish(ctx, js, msg) // the caller bounds each attempt and retries
	}
	if cfg.CA.Dir != "" {
		p := ca.NewPlugged(cfg.CA.Dir, cfg.CA.ReloadDelay, cfg.TrustDomain, s.auth, notify, log.Named("ca"), now)
		s.http.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "meshagent", Subsystem: "signer", Name: "ca_reload_rejected_total",
			Help: "Reloads of the cacerts directory refused because the new material was invalid.",
		}, func() float64 { return float64(p.Rejected()) }))
		s.source = p
	} else {
		kek, err := ca.LoadKEK(cfg.CA.KEKFile)
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		s.source = ca.NewSelfSigned(ca.SelfSignedConfig{
			TrustDomain: cfg.TrustDomain, KeyAlg: cfg.CA.KeyAlg, Bucket: cfg.CA.KVBucket, Replicas: cfg.CA.KVReplicas,
			RootTTL: cfg.CA.RootTTL, CheckInterval: cfg.CA.CheckInterval, GracePercent: cfg.CA.GracePercent,
			NewKeyOnRotate: cfg.CA.NewKeyOnRotate, KEK: kek, MaxLeafTTL: cfg.Certs.MaxTTL, RotateMinInterval: cfg.CA.RotateMinInterval,
		}, js, s.auth, notify, log.Named("ca"), now)
	}
	s.http.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "meshagent", Subsystem: "signer", Name: "trust_changed_publish_failures_total",
		Help: "Failed attempts to publish trust.changed; each is retried until JetStream takes it.",
	}, func() float64 { return float64(s.source.AnnounceFailures()) }))
	verifier, err := s.newVerifier(now)
	if err != nil {
		return nil, err
	}
	if cfg.BusCallout.IssuerSeed != "" {
		if err := s.newCallout(verifier, now); err != nil {
			return nil, err
		}
	}
	var tokens issuer.TokenVerifier
	if verifier != nil {
		tokens = verifier
	}
	metrics := issuer.NewMetrics(s.http.Registry(), s.auth, now)
	publish := func(ctx context.Context, msg *nats.Msg) error { return bus.Publish(ctx, js, msg) }
	s.iss = issuer.New(issuer.Config{
		TrustDomain: cfg.TrustDomain, Instance: cfg.Instance, DefaultTTL: cfg.Certs.DefaultTTL,
		MaxTTL: cfg.Certs.MaxTTL, Signers: cfg.Certs.Signers,
	}, s.auth, tokens, publish, metrics, log.Named("issuer"), now)
	s.nats = natsapi.New(nc, s.iss, s.auth, s.source, cfg.TrustDomain, cfg.Workers, log.Named("nats"))
	s.http.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "meshagent", Subsystem: "signer", Name: "nats_requests_dropped_total",
		Help: "NATS requests dropped unanswered because -workers x 4 were already waiting (slow consumer); callers retry.",
	}, func() float64 { return float64(s.nats.Dropped()) }))
	s.http.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "meshagent", Subsystem: "signer", Name: "nats_slow_consumer_events_total",
		Help: "Slow-consumer errors on the signer's NATS subscriptions (each episode drops one or more requests).",
	}, func() float64 { return float64(s.nats.SlowConsumerEvents()) }))
	s.grpc = grpcapi.New(cfg.Listen.GRPC, s.iss, grpcapi.NewServingCerts(s.auth, cfg.Listen.DNSNames, cfg.Listen.IPs, now), log.Named("grpc"))
	s.http.AddReadyCheck("ca", s.auth.Ready)
	s.http.AddReadyCheck("nats", s.nats.Ready)
	s.http.AddReadyCheck("grpc", s.grpc.Ready)
	return s, nil
}

// Authority is the replica's CA state.
func (s *Service) Authority() *ca.Authority { return s.auth }

// Source is the replica's CA source (for forced rotation and checks).
func (s *Service) Source() Source { return s.source }

// GRPCAddr is the bound gRPC address, nil before it is bound.
func (s *Service) GRPCAddr() net.Addr { return s.grpc.Addr() }

// HTTPAddr is the bound health/metrics address, nil before it is bound.
func (s *Service) HTTPAddr() net.Addr { return s.http.Addr() }

// Ready reports nil once the CA is loaded, NATS is subscribed and gRPC is bound.
func (s *Service) Ready() error { return s.http.Ready() }

// Run loads the CA, then serves until ctx is done. It returns nil on cancellation,
// also when ctx ends during startup (Ctrl-C while waiting for JetStream is no failure).
func (s *Service) Run(parent context.Context) error {
	g, ctx := errgroup.WithContext(parent)
	g.Go(func() error { return s.http.Run(ctx) })
	if s.callout != nil {
		// First: no pod can connect to the bus until it runs.
		g.Go(func() error { return s.callout.Run(ctx) })
	}
	failed := func(err error) error {
		err = errors.Join(err, stop(g))
		if parent.Err() != nil {
			s.log.Info("startup interrupted", "error", err)
			return nil
		}
		return err
	}
	// Keys first: they need no JetStream, and the callout admits pods once it has them.
	if s.keys != nil {
		if err := s.keys.Load(ctx); err != nil {
			return failed(err)
		}
		g.Go(func() error { return s.keys.Run(ctx) })
	} else if s.cfg.Auth.TokenReview {
		s.log.Info("bearer tokens verified by TokenReview", "url", s.cfg.Auth.TokenReviewURL, "audience", s.cfg.Auth.Audience)
	} else {
		s.log.Warn("no -jwks-file, -jwks-url, -token-issuer-discovery or -token-review: bearer tokens are refused, only certificate renewals are served")
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := s.ensureStream(sctx); err != nil {
		return failed(err)
	}
	if err := s.source.Start(sctx); err != nil {
		return failed(fmt.Errorf("ca: %w", err))
	}
	g.Go(func() error { return s.source.Run(ctx) })
	g.Go(func() error { return s.nats.Run(ctx) })
	g.Go(func() error { return s.grpc.Run(ctx) })
	mat := s.auth.Current()
	s.log.Info("signer started", "instance", s.cfg.Instance, "trust_domain", s.cfg.TrustDomain,
		"root", mat.RootFingerprint(), "generation", mat.Generation, "mode", s.mode())
	return g.Wait()
}

// setupTimeout bounds the JetStream set-up at start (the event stream, the CA
// bucket and root); every call in it is retried in short attempts (bus.Retry), so a
// cold cluster electing its leader delays the signer by seconds instead of failing it.
const setupTimeout = time.Minute

// ensureStream creates the event stream when it does not exist yet, and leaves an
// existing one as its operator (or meshctl, or the rotator) configured it.
func (s *Service) ensureStream(ctx context.Context) error {
	return bus.Retry(ctx, s.log, "event stream "+events.StreamEvents, func(ctx context.Context) error {
		_, err := s.js.Stream(ctx, events.StreamEvents)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		if _, err := bus.EnsureEventStream(ctx, s.js, s.cfg.Stream.Replicas, s.cfg.Stream.MaxAge); err != nil {
			return err
		}
		s.log.Info("event stream created", "stream", events.StreamEvents)
		return nil
	})
}

func (s *Service) mode() string {
	if s.cfg.CA.Dir != "" {
		return "plugged-in"
	}
	return "self-signed"
}

// errStartup cancels the group when startup fails.
var errStartup = errors.New("startup failed")

func stop(g *errgroup.Group) error {
	g.Go(func() error { return errStartup })
	if err := g.Wait(); err != nil && !errors.Is(err, errStartup) {
		return err
	}
	return nil
}

// newVerifier builds what checks bearer tokens: offline against a JWKS (a file, a
// URL, or discovery), or by the API server's TokenReview; nil when none is set.
func (s *Service) newVerifier(now func() time.Time) (buscallout.Verifier, error) {
	a := s.cfg.Auth
	if a.JWKSFile == "" && a.JWKSURL == "" && !a.Discover && !a.TokenReview {
		return nil, nil
	}
	client, err := authn.NewHTTPClient(a.CAFile)
	if err != nil {
		return nil, fmt.Errorf("-token-issuer-ca-file: %w", err)
	}
	if a.TokenReview {
		return &authn.TokenReviewer{URL: a.TokenReviewURL, Client: client, BearerFile: a.BearerFile, Audience: a.Audience,
			TrustDomain: s.cfg.TrustDomain, CacheTTL: a.TokenReviewCache, Log: s.log.Named("tokenreview"), Now: now}, nil
	}
	s.keys = &authn.KeySet{File: a.JWKSFile, URL: a.JWKSURL, Discover: a.Discover, Issuer: a.Issuer,
		BearerFile: a.BearerFile, Refresh: a.JWKSRefresh, MinRefresh: a.JWKSMinRefresh,
		Client: client, Log: s.log.Named("jwks"), Now: now}
	return &authn.JWTVerifier{Keys: s.keys, Issuer: a.Issuer, Audience: a.Audience, TrustDomain: s.cfg.TrustDomain, Leeway: 30 * time.Second, Now: now}, nil
}

// newCallout builds the bus auth callout: its own connection, as the callout user.
func (s *Service) newCallout(verifier buscallout.Verifier, now func() time.Time) error {
	issuer, err := policy.ReadSeed(s.cfg.BusCallout.IssuerSeed, nkeys.PrefixByteAccount)
	if err != nil {
		return fmt.Errorf("-bus-callout-seed: %w", err)
	}
	bc := s.cfg.Bus
	bc.CredsFile, bc.TokenFile, bc.NKeyFile = "", "", s.cfg.BusCallout.NKeyFile
	bc.Name += "/callout"
	bc.AsService(policy.Callout)
	log := s.log.Named("callout")
	dial := func(ctx context.Context) (*nats.Conn, error) { return bus.Connect(ctx, bc, log) }
	s.callout = buscallout.New(issuer, verifier, dial, s.http.Registry(), log, now)
	s.http.AddReadyCheck("bus_callout", s.callout.Ready)
	return nil
}
