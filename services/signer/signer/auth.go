package signer

import (
	"context"
	"crypto/x509"
	"fmt"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/buscallout"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// newVerifier builds what checks bearer tokens (authn.Config.Build); nil when
// none is set.
func (s *Signer) newVerifier(clk clock.Clock) (buscallout.Verifier, error) {
	v, keys, err := s.cfg.Auth.Build(s.cfg.TrustDomain, clk, s.log)
	if err != nil || v == nil {
		return nil, err
	}
	s.keys = keys
	return v, nil
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
	s.callout = buscallout.New(issuer, verifier, certs, dial, reg, log, clk).Limit(s.cfg.BusCallout.Pods).NodeAgents(s.cfg.BusCallout.NodeAgents)
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
