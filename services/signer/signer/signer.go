// Package signer is meshagent's CA as a service on the one lifecycle (pkg/lifecycle):
// Load reads its config, New builds a replica on a bus connection (CA material,
// plugged-in or self-signed; authentication; the issuer; the NATS and gRPC front
// ends; the bus auth callout) and Run starts, serves and stops it. Build, start,
// ready and stop are all in this file; how callers are authenticated is in auth.go.
package signer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/authn"
	"github.com/meshagent/meshagent/services/signer/internal/buscallout"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/grpcapi"
	"github.com/meshagent/meshagent/services/signer/internal/issued"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
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
	quorum  *bus.QuorumWatch // the replication of the streams and buckets it writes
	fed     *fed             // SPIFFE bundle endpoint and foreign-bundle follower (federation.go)
	// rootCM publishes the trust bundle into every namespace (nil unless -root-configmap).
	rootCM *rootcm.Publisher
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
	s := &Signer{cfg: cfg, log: d.Log, js: js, auth: &ca.Authority{}, issued: issued.New(js, cfg.CA.KVReplicas, d.Log.Named("issued"))}
	counter := func(name, help string, value func() uint64) {
		d.Metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "meshagent", Subsystem: "signer", Name: name, Help: help,
		}, func() float64 { return float64(value()) }))
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
	s.iss = issuer.New(issuer.Config{
		TrustDomain: cfg.TrustDomain, Instance: cfg.Instance, DefaultTTL: cfg.Certs.DefaultTTL,
		MaxTTL: cfg.Certs.MaxTTL, PodMaxTTL: cmp.Or(cfg.Certs.PodMaxTTL, cfg.Certs.DefaultTTL), Signers: cfg.Certs.Signers, Nodes: nodes,
		Named:   ca.NewNamedSigners(cfg.Certs.SignersDir, cfg.Certs.Signers),
		Records: s.issued, Lives: lives, MaxEarlyPerMinute: cfg.Certs.MaxEarlyPerMinute,
	}, s.auth, tokens, publish, metrics, d.Log.Named("issuer"), d.Clock)
	s.nats = natsapi.New(d.Bus, s.iss, s.auth, s.source, cfg.TrustDomain, cfg.Workers, cfg.BusCallout.SignByIdentity, d.Log.Named("nats"))
	counter("nats_requests_dropped_total",
		fmt.Sprintf("NATS requests dropped unanswered because -workers x %d were already waiting (slow consumer); callers retry.", natsapi.PendingPerWorker), s.nats.Dropped)
	counter("nats_slow_consumer_events_total",
		"Slow-consumer errors on the signer's NATS subscriptions (each episode drops one or more requests).", s.nats.SlowConsumerEvents)
	s.grpc = grpcapi.New(cfg.Listen.GRPC, s.iss, grpcapi.NewServingCerts(s.auth, cfg.Listen.DNSNames, cfg.Listen.IPs, d.Clock), d.Log.Named("grpc"))
	if err := s.newFederation(d.Metrics, d.Clock); err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	if err := s.newRootConfigMap(counter, d); err != nil {
		return nil, err
	}
	if s.quorum, err = bus.NewQuorumWatch(js, []string{events.StreamEvents, events.StreamPodEvents, "KV_" + cfg.CA.KVBucket, "KV_" + policy.BucketIssued},
		"signer", d.Metrics, d.Log.Named("quorum")); err != nil {
		return nil, err
	}
	d.Health.AddReadyCheck("ca", s.auth.Ready)
	d.Health.AddReadyCheck("nats", s.nats.Ready)
	d.Health.AddReadyCheck("grpc", s.grpc.Ready)
	return s, nil
}

// newSource builds the CA source: the Istio cacerts directory when -cacerts-dir is
// set, else a self-signed root kept (sealed) in JetStream KV.
func (s *Signer) newSource(counter func(name, help string, value func() uint64), clk clock.Clock) error {
	cfg := s.cfg
	origin := "meshagent/signer/" + cfg.Instance
	notify := func(ctx context.Context, tc events.TrustChanged) error {
		if s.announcedAlready(ctx, tc) {
			return nil // another replica did: pods hear of a change once
		}
		msg, err := events.Encode(events.SubjectTrustChanged, events.Meta{Source: origin, ID: fmt.Sprintf("trust-%s-%d", cfg.TrustDomain, tc.Generation)}, tc)
		if err != nil {
			return err
		}
		return bus.Publish(ctx, s.js, msg) // the caller bounds each attempt and retries
	}
	if cfg.CA.Dir != "" {
		p := ca.NewPlugged(cfg.CA.Dir, cfg.CA.ReloadDelay, cfg.TrustDomain, s.auth, notify, s.log.Named("ca"), clk)
		p.ForceRootChange = cfg.CA.ForceRootChange
		counter("ca_reload_rejected_total",
			"Reloads of the cacerts directory refused because the new material was invalid, or would strand the fleet (a CA chaining to no root trusted now).", p.Rejected)
		s.source = p
		return nil
	}
	kek, err := ca.LoadKEK(cfg.CA.KEKFile)
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	s.source = ca.NewSelfSigned(ca.SelfSignedConfig{
		TrustDomain: cfg.TrustDomain, KeyAlg: cfg.CA.KeyAlg, Bucket: cfg.CA.KVBucket, Replicas: cfg.CA.KVReplicas,
		RootTTL: cfg.CA.RootTTL, CheckInterval: cfg.CA.CheckInterval, GracePercent: cfg.CA.GracePercent,
		NewKeyOnRotate: cfg.CA.NewKeyOnRotate, KEK: kek, MaxLeafTTL: cfg.Certs.MaxTTL, RotateMinInterval: cfg.CA.RotateMinInterval,
	}, s.js, s.auth, notify, s.log.Named("ca"), clk)
	return nil
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

// GRPCAddr is the bound address of the Istio CA gRPC API, nil before Run binds it.
func (s *Signer) GRPCAddr() net.Addr { return s.grpc.Addr() }

// Run starts the signer and serves until ctx is done, then stops every part (gRPC
// gracefully, within five seconds) and returns nil. Start-up goes in this order:
//  1. the bus callout, from the first moment: no pod can connect to the bus without it;
//  2. the token keys (no JetStream needed; the callout admits pods once it has them),
//     then kept fresh;
//  3. the event stream and the CA material from JetStream (retried while it is cold);
//  4. the NATS and gRPC front ends, ready once subscribed and bound.
//
// A failure in steps 2 and 3 is Run's error, unless ctx ended meanwhile: Ctrl-C
// while waiting for JetStream is no failure.
func (s *Signer) Run(ctx context.Context) error {
	tasks := []func(context.Context) error{s.serve, s.quorum.Run}
	if s.callout != nil {
		tasks = append(tasks, s.callout.Run)
	}
	if s.cfg.Listen.Pprof != "" {
		tasks = append(tasks, s.servePprof)
	}
	if s.rootCM != nil {
		tasks = append(tasks, s.rootCM.Run)
	}
	return lifecycle.Tasks(ctx, tasks...)
}

// serve loads the token keys and keeps them fresh beside serveCA.
func (s *Signer) serve(ctx context.Context) error {
	switch {
	case s.keys != nil:
		if err := s.keys.Load(ctx); err != nil {
			return s.startupFailed(ctx, err)
		}
		return lifecycle.Tasks(ctx, s.keys.Run, s.serveCA)
	case s.cfg.Auth.TokenReview:
		s.log.Info("bearer tokens verified by TokenReview", "url", s.cfg.Auth.TokenReviewURL, "audience", s.cfg.Auth.Audience)
	default:
		s.log.Warn("no -jwks-file, -jwks-url, -token-issuer-discovery or -token-review: bearer tokens are refused, only certificate renewals are served")
	}
	return s.serveCA(ctx)
}

// serveCA loads the CA, then answers on NATS and gRPC and keeps the CA material
// current until ctx is done.
func (s *Signer) serveCA(ctx context.Context) error {
	if err := s.loadCA(ctx); err != nil {
		return s.startupFailed(ctx, err)
	}
	mat := s.auth.Current()
	s.log.Info("signer started", "instance", s.cfg.Instance, "trust_domain", s.cfg.TrustDomain,
		"root", mat.RootFingerprint(), "generation", mat.Generation, "mode", s.mode())
	return lifecycle.Tasks(ctx, append([]func(context.Context) error{s.source.Run, s.nats.Run, s.grpc.Run}, s.fed.tasks()...)...)
}

// loadCA makes sure the event stream exists and loads the CA material.
func (s *Signer) loadCA(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := s.ensureStream(ctx); err != nil {
		return err
	}
	if err := s.issued.Open(ctx); err != nil {
		return fmt.Errorf("issued records: %w", err)
	}
	if err := s.source.Start(ctx); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	return nil
}

// startupFailed is err, or nil when the start-up was cut short by ctx ending.
func (s *Signer) startupFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		s.log.Info("startup interrupted", "error", err)
		return nil
	}
	return err
}

// setupTimeout bounds the JetStream set-up at start (the event stream, the CA
// bucket and root); every call in it is retried in short attempts (bus.Retry), so a
// cold cluster electing its leader delays the signer by seconds instead of failing it.
const setupTimeout = time.Minute

// ensureStream creates the event streams (the CA's history and the pods' events)
// when they do not exist yet, and leaves existing ones as their operator (or
// meshctl) configured them. A CA history stream from before the split, which
// captured the pods' events too, is narrowed to the CA's subjects.
func (s *Signer) ensureStream(ctx context.Context) error {
	return bus.Retry(ctx, s.log, "event stream "+events.StreamEvents, func(ctx context.Context) error {
		ca, err := s.js.Stream(ctx, events.StreamEvents)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		_, perr := s.js.Stream(ctx, events.StreamPodEvents)
		if perr != nil && !errors.Is(perr, jetstream.ErrStreamNotFound) {
			return perr
		}
		if err == nil && perr == nil && slices.Equal(ca.CachedInfo().Config.Subjects, events.CAEventSubjects) {
			return nil
		}
		if _, err := bus.EnsureEventStream(ctx, s.js, s.cfg.Stream.Replicas, s.cfg.Stream.MaxAge); err != nil {
			return err
		}
		s.log.Info("event streams created", "stream", events.StreamEvents, "pod_stream", events.StreamPodEvents)
		return nil
	})
}

// announcedAlready reports whether the stream's last trust.changed is tc's
// announcement already: each replica that sees a change announces it if nobody
// has (the writer may have died before it could), and the event id makes
// JetStream store it once, but pods subscribe to the subject itself and would get
// every copy. It counts only as tc's if it carries the same trust domain,
// generation and roots, endorsed by a key of those roots: anyone who may publish
// on the subject (a leaked credential) must not be able to silence a change. When
// the stream cannot say, tc is published (a duplicate is harmless: pods ignore a
// generation they have).
func (s *Signer) announcedAlready(ctx context.Context, tc events.TrustChanged) bool {
	st, err := s.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return false
	}
	raw, err := st.GetLastMsgForSubject(ctx, events.SubjectTrustChanged)
	if err != nil {
		return false
	}
	msg := nats.NewMsg(raw.Subject)
	msg.Header, msg.Data = raw.Header, raw.Data
	last, _, err := events.Decode[events.TrustChanged](msg)
	if err != nil || last.TrustDomain != tc.TrustDomain || last.Generation != tc.Generation || !slices.Equal(last.Roots, tc.Roots) {
		return false
	}
	roots, err := pki.ParseCertPEMs(tc.Roots)
	if err != nil {
		return false
	}
	signed, err := events.EndorsedBytes(last.TrustDomain, last.Generation, last.Roots)
	if err != nil {
		return false
	}
	for _, e := range last.Endorsements {
		chain, err := pki.ParseCertPEMs(e.Chain)
		if err == nil && pki.VerifyEndorsement(roots, signed, e.KeyID, e.Signature, chain) == nil {
			return true
		}
	}
	return false
}

func (s *Signer) mode() string {
	if s.cfg.CA.Dir != "" {
		return "plugged-in"
	}
	return "self-signed"
}
