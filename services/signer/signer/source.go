package signer

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// newSource builds the CA source: the Istio cacerts directory when -cacerts-dir is
// set, else a self-signed root kept (sealed) in JetStream KV.
func (s *Signer) newSource(counter func(name, help string, value func() uint64), clk clock.Clock) error {
	cfg := s.cfg
	if cfg.CA.Dir != "" {
		p := ca.NewPlugged(cfg.CA.Dir, cfg.CA.ReloadDelay, cfg.TrustDomain, s.auth, s.announceTrust, s.log.Named("ca"), clk)
		p.ForceRootChange = cfg.CA.ForceRootChange
		p.ExtraRoots = s.externalRoots()
		p.Keeper = &keptRoots{js: s.js, bucket: cfg.CA.KVBucket, replicas: cfg.CA.KVReplicas, clk: clk, log: s.log.Named("ca")}
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
		ExtraRoots: s.externalRoots(),
	}, s.js, s.auth, s.announceTrust, s.log.Named("ca"), clk)
	return nil
}

// announceTrust publishes tc on trust.changed unless another replica did: pods
// hear of a change once. It makes one attempt, bounded by bus.PublishAttempt (a
// publish to a stream leader that just died is never acknowledged): the CA
// source's announcer is the one retry layer, and retries it on its backoff until
// the stream takes it or a newer generation supersedes it.
func (s *Signer) announceTrust(ctx context.Context, tc events.TrustChanged) error {
	if s.announcedAlready(ctx, tc) {
		return nil
	}
	msg, err := events.Encode(events.SubjectTrustChanged, events.Meta{Source: "meshagent/signer/" + s.cfg.Instance, ID: fmt.Sprintf("trust-%s-%d", s.cfg.TrustDomain, tc.Generation)}, tc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, bus.PublishAttempt)
	defer cancel()
	if _, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(msg.Header.Get(events.HeaderID))); err != nil {
		return fmt.Errorf("publish %s: %w", msg.Subject, err)
	}
	return nil
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

// keptRoots keeps the roots of the plugged-in material installed last in the CA
// bucket (key pluggedRootsKey), which only the signers read and write: a restart
// checks the cacerts directory against them.
type keptRoots struct {
	js       jetstream.JetStream
	bucket   string
	replicas int
	clk      clock.Clock
	log      hclog.Logger
}

const pluggedRootsKey = "plugged-roots"

var _ ca.Keeper = (*keptRoots)(nil)

func (k *keptRoots) kv(ctx context.Context) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := bus.Retry(ctx, k.clk, k.log, "ca bucket "+k.bucket, func(ctx context.Context) error {
		var err error
		kv, err = k.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: k.bucket,
			Description: "meshagent CA: the roots of the plugged-in material installed last",
			History:     1, Replicas: max(1, k.replicas), Storage: jetstream.FileStorage})
		return err
	})
	return kv, err
}

// Kept reads the kept roots; nil when none were kept.
func (k *keptRoots) Kept(ctx context.Context) ([]*x509.Certificate, error) {
	kv, err := k.kv(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, pluggedRootsKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return pki.ParseCertsPEM(e.Value())
}

// Keep writes roots as the kept ones.
func (k *keptRoots) Keep(ctx context.Context, roots []*x509.Certificate) error {
	kv, err := k.kv(ctx)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, pluggedRootsKey, pki.EncodeCertsPEM(roots))
	return err
}
