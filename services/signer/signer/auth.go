package signer

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/authn"
	"github.com/meshagent/meshagent/services/signer/internal/buscallout"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// newVerifier builds what checks bearer tokens: offline against a JWKS (a file, a
// URL, or discovery), or by the API server's TokenReview; nil when none is set.
func (s *Signer) newVerifier(clk clock.Clock) (buscallout.Verifier, error) {
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
			TrustDomain: s.cfg.TrustDomain, CacheTTL: a.TokenReviewCache, Log: s.log.Named("tokenreview"), Clock: clk}, nil
	}
	s.keys = &authn.KeySet{File: a.JWKSFile, URL: a.JWKSURL, Discover: a.Discover, Issuer: a.Issuer,
		BearerFile: a.BearerFile, Refresh: a.JWKSRefresh, MinRefresh: a.JWKSMinRefresh,
		Client: client, Log: s.log.Named("jwks"), Clock: clk}
	return &authn.JWTVerifier{Keys: s.keys, Issuer: a.Issuer, Audience: a.Audience, TrustDomain: s.cfg.TrustDomain, Leeway: 30 * time.Second, Clock: clk}, nil
}

// newCallout builds the bus auth callout, which admits pods to the bus by their
// token, or by a client certificate this mesh issued to a pod (checked against the
// current trust bundle and the issued records): it dials its own connection, as the
// callout user, when it runs.
func (s *Signer) newCallout(verifier buscallout.Verifier, reg prometheus.Registerer, clk clock.Clock) error {
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
	certs := &buscallout.Certificates{TrustDomain: s.cfg.TrustDomain, Records: s.issued, Roots: func() []*x509.Certificate {
		if m := s.auth.Current(); m != nil {
			return m.Roots
		}
		return nil
	}}
	s.callout = buscallout.New(issuer, verifier, certs, dial, reg, log, clk).Limit(s.cfg.BusCallout.Pods)
	return nil
}

// newNodeAuthorizer builds what lets trusted node agents impersonate workloads on
// their node; nil (nobody may) without -trusted-node-accounts.
func (s *Signer) newNodeAuthorizer() (issuer.NodeAuthorizer, error) {
	n := s.cfg.Nodes
	if len(n.TrustedAccounts) == 0 {
		return nil, nil
	}
	client, err := authn.NewHTTPClient(n.CAFile)
	if err != nil {
		return nil, fmt.Errorf("-node-api-ca-file: %w", err)
	}
	return &authn.NodeAuthorizer{URL: n.APIURL, Client: client, BearerFile: n.BearerFile,
		Trusted: n.TrustedAccounts, TrustDomain: s.cfg.TrustDomain}, nil
}
