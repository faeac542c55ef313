package signer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/nats-io/nats.go/jetstream"
)

type task = func(context.Context) error

// Run starts the signer and serves until ctx is done, then stops every part (gRPC
// gracefully, within five seconds) and returns nil. Every part is one task of one
// list, as SPIRE's server runs; start-up goes in this order:
//  1. the bus callout, from the first moment: no pod can connect to the bus without it;
//  2. the token keys (no JetStream needed; the callout admits pods once it has them),
//     then kept fresh;
//  3. the event stream and the CA material from JetStream (retried while it is cold);
//  4. the NATS and gRPC front ends, ready once subscribed and bound, the CA
//     material kept current and federation.
//
// A failure in steps 2 and 3 is Run's error, unless ctx ended meanwhile: Ctrl-C
// while waiting for JetStream is no failure.
func (s *Signer) Run(ctx context.Context) error {
	keysLoaded, caLoaded := make(chan struct{}), make(chan struct{})
	tasks := []task{
		func(ctx context.Context) error { return s.start(ctx, keysLoaded, caLoaded) },
		s.quorum.Run,
	}
	if s.callout != nil {
		tasks = append(tasks, s.callout.Run)
	}
	if s.cfg.Listen.Pprof != "" {
		tasks = append(tasks, s.servePprof)
	}
	if s.rootCM != nil {
		tasks = append(tasks, s.rootCM.Run)
	}
	if s.keys != nil {
		tasks = append(tasks, after(keysLoaded, s.keys.Run))
	}
	for _, t := range append([]task{s.source.Run, s.nats.Run, s.grpc.Run}, s.fed.Tasks()...) {
		tasks = append(tasks, after(caLoaded, t))
	}
	return lifecycle.Tasks(ctx, tasks...)
}

// after is t once ready is closed; nil if ctx ends first (the start-up failed,
// or was cut short).
func after(ready <-chan struct{}, t task) task {
	return func(ctx context.Context) error {
		select {
		case <-ready:
			return t(ctx)
		case <-ctx.Done():
			return nil
		}
	}
}

// start loads the token keys, closing keysLoaded, then the CA, closing caLoaded.
func (s *Signer) start(ctx context.Context, keysLoaded, caLoaded chan<- struct{}) error {
	if err := s.loadKeys(ctx); err != nil {
		return s.startupFailed(ctx, err)
	}
	close(keysLoaded)
	if err := s.loadCA(ctx); err != nil {
		return s.startupFailed(ctx, err)
	}
	if mat := s.auth.Current(); mat != nil {
		s.log.Info("signer started", "instance", s.cfg.Instance, "trust_domain", s.cfg.TrustDomain,
			"root", mat.RootFingerprint(), "generation", mat.Generation, "mode", s.mode())
	} else {
		// A plugged-in directory refused at start-up: the source installs it once
		// it holds material the fleet trusts; until then requests are unavailable.
		s.log.Warn("signer started without CA material", "instance", s.cfg.Instance, "mode", s.mode())
	}
	close(caLoaded)
	return nil
}

// loadKeys loads the token keys when tokens are verified against a JWKS, and
// says how they are verified otherwise.
func (s *Signer) loadKeys(ctx context.Context) error {
	switch {
	case s.keys != nil:
		return s.keys.Load(ctx)
	case s.cfg.Auth.TokenReview:
		s.log.Info("bearer tokens verified by TokenReview", "url", s.cfg.Auth.TokenReviewURL, "audience", s.cfg.Auth.Audience)
	default:
		s.log.Warn("no -jwks-file, -jwks-url, -token-issuer-discovery or -token-review: bearer tokens are refused, only certificate renewals are served")
	}
	return nil
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
// meshctl) configured them.
func (s *Signer) ensureStream(ctx context.Context) error {
	return bus.Retry(ctx, s.clk, s.log, "event stream "+events.StreamEvents, func(ctx context.Context) error {
		for _, name := range []string{events.StreamEvents, events.StreamPodEvents} {
			_, err := s.js.Stream(ctx, name)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return s.createStreams(ctx)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// createStreams creates the event streams.
func (s *Signer) createStreams(ctx context.Context) error {
	if _, err := bus.EnsureEventStream(ctx, s.js, s.cfg.Stream.Replicas, s.cfg.Stream.MaxAge); err != nil {
		return err
	}
	s.log.Info("event streams created", "stream", events.StreamEvents, "pod_stream", events.StreamPodEvents)
	return nil
}
