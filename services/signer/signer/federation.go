package signer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/signer/internal/federation"
	"github.com/meshagent/meshagent/services/signer/internal/grpcapi"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// fed is the signer's part in federation: the bundle endpoint of this trust
// domain and the follower of foreign ones. Every replica follows on its own and
// publishes what it fetched on trust.federated, endorsed by the CA key; pods
// take it from the bus and never fetch from the internet.
type fed struct {
	s        *Signer
	clk      clock.Clock
	handler  http.Handler
	follower *federation.Follower
	addr     atomic.Pointer[net.Addr]
}

// newFederation builds the endpoint and the follower from the config, and
// registers the followed domains' metrics on reg; nothing runs.
func (s *Signer) newFederation(reg prometheus.Registerer, clk clock.Clock) error {
	cfg := s.cfg.Federation
	td, err := spiffeid.TrustDomainFromString(s.cfg.TrustDomain)
	if err != nil {
		return err
	}
	f := &fed{s: s, clk: clk}
	if cfg.Listen != "" {
		if f.handler, err = federation.Handler(td, s.currentRoots, cfg.RefreshHint); err != nil {
			return err
		}
	}
	srcs, err := s.cfg.FederationSources()
	if err != nil {
		return err
	}
	if len(srcs) > 0 {
		var roots *x509.CertPool
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return fmt.Errorf("-spiffe-bundle-ca-file: %w", err)
			}
			roots = x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return fmt.Errorf("-spiffe-bundle-ca-file: no PEM certificate in %s", cfg.CAFile)
			}
		}
		var aliases []spiffeid.TrustDomain
		for _, a := range s.cfg.Federation.Aliases {
			atd, err := federation.ParseTrustDomain(a)
			if err != nil {
				return fmt.Errorf("-trust-domain-aliases: %w", err)
			}
			aliases = append(aliases, atd)
		}
		f.follower, err = federation.NewFollower(federation.Config{Self: td, Aliases: aliases, WebPKIRoots: roots,
			MinRefresh: cfg.MinRefresh, MaxRefresh: cfg.MaxRefresh, MaxBundleSize: int64(cfg.MaxBundleSize), OnBundle: f.publish, OnFailure: f.logFailure}, clk)
		if err != nil {
			return err
		}
		if err := f.follower.Follow(srcs); err != nil {
			return err
		}
		if reg != nil {
			if err := reg.Register(federationMetrics{f.follower}); err != nil {
				return fmt.Errorf("federation metrics: %w", err)
			}
		}
	}
	s.nats.SetFederationStatus(f.status)
	s.fed = f
	return nil
}

// currentRoots is this domain's bundle now (nil before the CA is loaded).
func (s *Signer) currentRoots() ([]*x509.Certificate, uint64) {
	m := s.auth.Current()
	if m == nil {
		return nil, 0
	}
	return m.Roots, m.Generation
}

// BundleEndpointAddr is the bound address of the SPIFFE bundle endpoint, nil
// before Run binds it or when it is not served.
func (s *Signer) BundleEndpointAddr() net.Addr {
	if s.fed == nil {
		return nil
	}
	if a := s.fed.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// tasks are what runs once the CA is loaded.
func (f *fed) tasks() []func(context.Context) error {
	out := []func(context.Context) error{f.retireUnfollowed}
	if f.handler != nil {
		out = append(out, f.serve)
	}
	if f.follower != nil {
		out = append(out, f.follower.Run)
	}
	return out
}

// serve answers the bundle endpoint over HTTPS with the configured web-PKI
// certificate (re-read on each handshake, so a renewed file is picked up), or with
// an X509-SVID our CA issues (https_spiffe, -bundle-endpoint-spiffe-id).
func (f *fed) serve(ctx context.Context) error {
	cfg := f.s.cfg.Federation
	getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		return &c, err
	}
	if cfg.SPIFFEID != "" {
		id, err := url.Parse(cfg.SPIFFEID)
		if err != nil {
			return fmt.Errorf("bundle endpoint: %w", err)
		}
		svids := grpcapi.NewSVIDServingCerts(f.s.auth, id, f.clk)
		getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return svids.Get() }
	}
	if _, err := getCert(nil); err != nil {
		return fmt.Errorf("bundle endpoint: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("bundle endpoint: %w", err)
	}
	addr := ln.Addr()
	f.addr.Store(&addr)
	srv := &http.Server{Handler: f.handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:  f.s.log.Named("bundle-endpoint").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert}}
	f.s.log.Info("SPIFFE bundle endpoint serving", "addr", addr.String(), "spiffe_id", cfg.SPIFFEID)
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

// logFailure logs a failed refresh: a warning when the domain starts failing,
// then at debug level (meshctl trust and the metrics show every one).
func (f *fed) logFailure(td spiffeid.TrustDomain, st federation.Status, first bool) {
	log := f.s.log.Debug
	if first {
		log = f.s.log.Warn
	}
	log("foreign trust domain refresh failed (the last good bundle, if any, is kept)", "trust_domain", td.Name(),
		"source", st.Where, "reason", st.ErrReason, "error", st.Err, "retry_at", st.NextRefresh.Format(time.RFC3339))
}

// publish announces a foreign bundle (b nil: no longer followed) on its
// trust.federated subject, endorsed by the current CA key, after every fetch:
// a pod that started since hears it within one refresh hint (pods ignore a
// version they have and never read the stream). An error fails the refresh
// (the follower shows it and retries).
func (f *fed) publish(td spiffeid.TrustDomain, b *spiffebundle.Bundle, st federation.Status) error {
	return f.announce(td, b, st)
}

func (f *fed) announce(td spiffeid.TrustDomain, b *spiffebundle.Bundle, st federation.Status) error {
	m := f.s.auth.Current()
	if m == nil {
		f.s.log.Warn("foreign bundle not announced: CA not loaded", "trust_domain", td.Name())
		return errors.New("CA not loaded yet")
	}
	now := f.clk.Now()
	ev := events.TrustFederated{TrustDomain: f.s.cfg.TrustDomain, Foreign: td.Name(), Version: uint64(now.UnixNano()), Removed: b == nil}
	ev.Source, ev.Sequence, ev.RefreshHint, ev.FetchedAt = st.Where, st.Sequence, st.RefreshHint, st.FetchedAt
	if b != nil {
		ev.Roots = pki.CertPEMs(b.X509Authorities())
	}
	es, err := trustbundle.EndorseFederated(ev.TrustDomain, ev.Foreign, ev.Version, ev.Roots, m.Key)
	if err != nil {
		f.s.log.Error("foreign bundle not endorsed", "trust_domain", td.Name(), "error", err)
		return fmt.Errorf("endorse: %w", err)
	}
	if len(m.Chain) > 1 {
		for i := range es {
			es[i].Chain = m.IntermediatePEMs()
		}
	}
	ev.Endorsements = es
	subj, err := events.TrustFederatedSubject(ev.Foreign)
	if err != nil {
		f.s.log.Error("foreign bundle not announced", "error", err)
		return err
	}
	msg, err := events.Encode(subj, events.Meta{Source: "meshagent/signer/" + f.s.cfg.Instance}, ev)
	if err != nil {
		// A bundle too large for an event (events.MaxEventSize) lands here at
		// every refresh: the domain shows it (meshctl trust, metrics).
		f.s.log.Error("foreign bundle not announced", "trust_domain", td.Name(), "roots", len(ev.Roots), "error", err)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bus.Publish(ctx, f.s.js, msg); err != nil {
		f.s.log.Warn("foreign bundle announcement failed (retried after -spiffe-bundle-min-refresh)", "trust_domain", td.Name(), "error", err)
		return err
	}
	f.s.log.Info("foreign trust domain bundle announced", "trust_domain", td.Name(), "roots", len(ev.Roots), "removed", ev.Removed, "source", ev.Source)
	return nil
}

// retireUnfollowed announces as removed every foreign domain whose last news
// on the stream is a bundle but which this signer no longer follows (dropped
// from the config since): pods stop trusting it without an operator's step.
func (f *fed) retireUnfollowed(ctx context.Context) error {
	followed := map[string]bool{}
	if f.follower != nil {
		for _, st := range f.follower.Status() {
			followed[st.TrustDomain] = true
		}
	}
	st, err := f.s.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return nil // no history: nothing was announced
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.TrustFederatedWildcard))
	if err != nil {
		f.s.log.Warn("cannot list foreign trust domains announced before", "error", err)
		return nil
	}
	for subj := range info.State.Subjects {
		raw, err := st.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			continue
		}
		last, _, err := events.Decode[events.TrustFederated](&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil || last.Removed || last.TrustDomain != f.s.cfg.TrustDomain || followed[last.Foreign] {
			continue
		}
		td, err := spiffeid.TrustDomainFromString(last.Foreign)
		if err != nil {
			continue
		}
		_ = f.announce(td, nil, federation.Status{Where: last.Source})
	}
	return nil
}
