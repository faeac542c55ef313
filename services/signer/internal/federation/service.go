package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ServiceConfig is a signer's part in federation, as its flags set it.
type ServiceConfig struct {
	TrustDomain string // this domain
	Instance    string // the signer replica: the source of its events and the status
	// Listen is the bundle endpoint's address; empty: not served. It serves
	// CertFile/KeyFile (web PKI), or the SVID of SPIFFEID (https_spiffe) that
	// SVID gives when set.
	Listen, CertFile, KeyFile, SPIFFEID string
	SVID                                func() (*tls.Certificate, error)
	RefreshHint                         time.Duration // of the served bundle
	// Sources are the foreign domains followed (none: nothing is followed);
	// CAFile holds the web-PKI roots of their endpoints (empty: the system's).
	Sources []Source
	CAFile  string
	// Aliases are trust domains accepted as this one: never followed.
	Aliases                []string
	MinRefresh, MaxRefresh time.Duration
	MaxBundleSize          int
}

// Authority is the CA material now (ca.Authority): nil before it is loaded.
type Authority interface {
	Current() *ca.Material
}

var _ Authority = (*ca.Authority)(nil)

// Service is a signer's part in federation: the bundle endpoint of this trust
// domain and the follower of foreign ones. Every replica follows on its own and
// publishes what it fetched on trust.federated, endorsed by the CA key; pods
// take it from the bus and never fetch from the internet.
type Service struct {
	cfg      ServiceConfig
	auth     Authority
	js       jetstream.JetStream
	log      hclog.Logger
	clk      clock.Clock
	handler  http.Handler
	follower *Follower
	addr     atomic.Pointer[net.Addr]
}

// NewService builds the endpoint and the follower from cfg, and registers the
// followed domains' metrics on reg (nil: none); nothing runs.
func NewService(cfg ServiceConfig, auth Authority, js jetstream.JetStream, reg prometheus.Registerer, log hclog.Logger, clk clock.Clock) (*Service, error) {
	td, err := spiffeid.TrustDomainFromString(cfg.TrustDomain)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, auth: auth, js: js, log: log, clk: clk}
	if cfg.Listen != "" {
		if s.handler, err = Handler(td, s.currentRoots, cfg.RefreshHint); err != nil {
			return nil, err
		}
	}
	if len(cfg.Sources) == 0 {
		return s, nil
	}
	if s.follower, err = s.newFollower(td); err != nil {
		return nil, err
	}
	if err := s.follower.Follow(cfg.Sources); err != nil {
		return nil, err
	}
	if reg != nil {
		if err := reg.Register(followerMetrics{s.follower}); err != nil {
			return nil, fmt.Errorf("federation metrics: %w", err)
		}
	}
	return s, nil
}

// newFollower builds the follower of the foreign domains, announcing each
// bundle it fetches.
func (s *Service) newFollower(td spiffeid.TrustDomain) (*Follower, error) {
	cfg := s.cfg
	var roots *x509.CertPool
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("-spiffe-bundle-ca-file: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-spiffe-bundle-ca-file: no PEM certificate in %s", cfg.CAFile)
		}
	}
	var aliases []spiffeid.TrustDomain
	for _, a := range cfg.Aliases {
		atd, err := ParseTrustDomain(a)
		if err != nil {
			return nil, fmt.Errorf("-trust-domain-aliases: %w", err)
		}
		aliases = append(aliases, atd)
	}
	return NewFollower(Config{Self: td, Aliases: aliases, WebPKIRoots: roots,
		MinRefresh: cfg.MinRefresh, MaxRefresh: cfg.MaxRefresh, MaxBundleSize: int64(cfg.MaxBundleSize),
		OnBundle: s.announce, OnFailure: s.logFailure}, s.clk)
}

// currentRoots is this domain's bundle now (nil before the CA is loaded).
func (s *Service) currentRoots() ([]*x509.Certificate, uint64) {
	m := s.auth.Current()
	if m == nil {
		return nil, 0
	}
	return m.Roots, m.Generation
}

// Addr is the bound address of the bundle endpoint, nil before it is bound or
// when it is not served.
func (s *Service) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// Followed is the status of every foreign domain followed (none: nil).
func (s *Service) Followed() []Status {
	if s.follower == nil {
		return nil
	}
	return s.follower.Status()
}

// Tasks are what runs once the CA is loaded: the retirement of domains no
// longer followed, the bundle endpoint and the follower.
func (s *Service) Tasks() []func(context.Context) error {
	out := []func(context.Context) error{s.retireUnfollowed}
	if s.handler != nil {
		out = append(out, s.serve)
	}
	if s.follower != nil {
		out = append(out, s.follower.Run)
	}
	return out
}

// serve answers the bundle endpoint over HTTPS with the configured web-PKI
// certificate (re-read on each handshake, so a renewed file is picked up), or with
// an X509-SVID our CA issues (https_spiffe, -bundle-endpoint-spiffe-id).
func (s *Service) serve(ctx context.Context) error {
	cfg := s.cfg
	getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		return &c, err
	}
	if cfg.SVID != nil {
		getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cfg.SVID() }
	}
	if _, err := getCert(nil); err != nil {
		return fmt.Errorf("bundle endpoint: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("bundle endpoint: %w", err)
	}
	addr := ln.Addr()
	s.addr.Store(&addr)
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:  s.log.Named("bundle-endpoint").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert}}
	s.log.Info("SPIFFE bundle endpoint serving", "addr", addr.String(), "spiffe_id", cfg.SPIFFEID)
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-done:
		return fmt.Errorf("bundle endpoint: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
