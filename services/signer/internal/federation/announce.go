package federation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// announceTimeout bounds the publishing of one trust.federated.
const announceTimeout = 10 * time.Second

// logFailure logs a failed refresh: a warning when the domain starts failing,
// then at debug level (meshctl trust and the metrics show every one).
func (s *Service) logFailure(td spiffeid.TrustDomain, st Status, first bool) {
	log := s.log.Debug
	if first {
		log = s.log.Warn
	}
	log("foreign trust domain refresh failed (the last good bundle, if any, is kept)", "trust_domain", td.Name(),
		"source", st.Where, "reason", st.ErrReason, "error", st.Err, "retry_at", st.NextRefresh.Format(time.RFC3339))
}

// announce publishes a foreign bundle (b nil: no longer followed) on its
// trust.federated subject, endorsed by the current CA key, after every fetch:
// a pod that started since hears it within one refresh hint (pods ignore a
// version they have and never read the stream). An error fails the refresh
// (the follower shows it and retries).
func (s *Service) announce(td spiffeid.TrustDomain, b *spiffebundle.Bundle, st Status) error {
	m := s.auth.Current()
	if m == nil {
		s.log.Warn("foreign bundle not announced: CA not loaded", "trust_domain", td.Name())
		return errors.New("CA not loaded yet")
	}
	now := s.clk.Now()
	ev := events.TrustFederated{TrustDomain: s.cfg.TrustDomain, Foreign: td.Name(), Version: uint64(now.UnixNano()), Removed: b == nil}
	ev.Source, ev.Sequence, ev.RefreshHint, ev.FetchedAt = st.Where, st.Sequence, st.RefreshHint, st.FetchedAt
	if b != nil {
		ev.Roots = pki.CertPEMs(b.X509Authorities())
	}
	es, err := trustbundle.EndorseFederated(ev.TrustDomain, ev.Foreign, ev.Version, ev.Roots, m.Key)
	if err != nil {
		s.log.Error("foreign bundle not endorsed", "trust_domain", td.Name(), "error", err)
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
		s.log.Error("foreign bundle not announced", "error", err)
		return err
	}
	msg, err := events.Encode(subj, events.Meta{Source: "meshagent/signer/" + s.cfg.Instance}, ev)
	if err != nil {
		// A bundle too large for an event (events.MaxEventSize) lands here at
		// every refresh: the domain shows it (meshctl trust, metrics).
		s.log.Error("foreign bundle not announced", "trust_domain", td.Name(), "roots", len(ev.Roots), "error", err)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), announceTimeout)
	defer cancel()
	if err := bus.Publish(ctx, s.js, msg); err != nil {
		s.log.Warn("foreign bundle announcement failed (retried after -spiffe-bundle-min-refresh)", "trust_domain", td.Name(), "error", err)
		return err
	}
	s.log.Info("foreign trust domain bundle announced", "trust_domain", td.Name(), "roots", len(ev.Roots), "removed", ev.Removed, "source", ev.Source)
	return nil
}

// retireUnfollowed announces as removed every foreign domain whose last news
// on the stream is a bundle but which this signer no longer follows (dropped
// from the config since): pods stop trusting it without an operator's step.
func (s *Service) retireUnfollowed(ctx context.Context) error {
	followed := map[string]bool{}
	for _, st := range s.Followed() {
		followed[st.TrustDomain] = true
	}
	st, err := s.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return nil // no history: nothing was announced
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.TrustFederatedWildcard))
	if err != nil {
		s.log.Warn("cannot list foreign trust domains announced before", "error", err)
		return nil
	}
	for subj := range info.State.Subjects {
		raw, err := st.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			continue
		}
		last, _, err := events.Decode[events.TrustFederated](&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil || last.Removed || last.TrustDomain != s.cfg.TrustDomain || followed[last.Foreign] {
			continue
		}
		td, err := spiffeid.TrustDomainFromString(last.Foreign)
		if err != nil {
			continue
		}
		_ = s.announce(td, nil, Status{Where: last.Source})
	}
	return nil
}
