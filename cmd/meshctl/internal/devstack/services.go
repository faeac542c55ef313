package devstack

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/democp"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
)

func (r *Runner) startSigner(ctx context.Context) error {
	grpcAddr, err := supervisor.FreeAddr()
	if err != nil {
		return err
	}
	kek, err := CAKEK(r.cfg.Dir)
	if err != nil {
		return err
	}
	args := []string{
		"-instance", "signer-0",
		"-ca-kek-file", kek,
		"-trust-domain", r.cfg.TrustDomain,
		"-root-ttl", r.cfg.RootTTL.String(),
		"-root-check-interval", r.cfg.RootCheck.String(),
		"-stream-max-age", cmp.Or(r.cfg.EventsMaxAge, bus.DefaultEventStreamMaxAge).String(),
		"-grpc-addr", grpcAddr,
		"-jwks-file", r.Stack.TokenIssuer.JWKS,
		"-token-issuer", r.Stack.TokenIssuer.Issuer,
		"-token-audience", r.Stack.TokenIssuer.Audience,
		"-nats-nkey", r.creds.SeedFile(policy.Signer),
		"-bus-callout-seed", r.creds.IssuerFile(),
		"-bus-callout-nkey", r.creds.SeedFile(policy.Callout),
		// Pods are admitted by this signer's callout and verified offline (JWKS):
		// the identity subject proves what a per-request check would (docs/security.md).
		"-bus-sign-id",
	}
	if r.cfg.RootRotateMinInterval > 0 {
		args = append(args, "-root-rotate-min-interval", r.cfg.RootRotateMinInterval.String())
	}
	nodeArgs, err := r.startNodeAPI()
	if err != nil {
		return err
	}
	signerArgs, err := r.partnerSigner()
	if err != nil {
		return err
	}
	fedArgs, err := r.federation()
	if err != nil {
		return err
	}
	// The node agents' service account is admitted on the leaf listener as
	// nodes (the node tier).
	p, err := r.spawnEnv(ctx, "signer", "signer", []string{"NODE_AGENT_ACCOUNTS=" + NodeTierAccount}, slices.Concat(args, nodeArgs, signerArgs, fedArgs)...)
	if err != nil {
		return err
	}
	r.Stack.Signer.Service, r.Stack.Signer.NATSSubject = stackfile.Service{HTTP: p.HTTP}, events.SignWildcard
	r.Stack.Signer.GRPCAddr, r.Stack.Signer.GRPCServerName = grpcAddr, "istiod.istio-system.svc"
	return nil
}

func (r *Runner) startRotator(ctx context.Context) error {
	p, err := r.spawn(ctx, "rotator", "rotator", "-instance", "rotator-0", "-nats-nkey", r.creds.SeedFile(policy.Rotator))
	if err != nil {
		return err
	}
	r.Stack.Rotator = stackfile.Service{HTTP: p.HTTP}
	return nil
}

// startControlPlane runs the demo xDS server in meshctl's own process: it stands for
// istiod, which the pods' relays connect to.
func (r *Runner) startControlPlane(ctx context.Context) error {
	var nodes []string
	for i := range r.cfg.Pods {
		id := fmt.Sprintf("demo-%d", i)
		nodes = append(nodes, "sidecar~"+id, NodeID(id, "default"))
	}
	cp := democp.New(democp.Config{Addr: "127.0.0.1:0", NodeIDs: nodes}, r.log.Named("democp"))
	cpctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(cpctx) }()
	r.stopCP = func() {
		cancel()
		<-done
	}
	select {
	case <-cp.Bound():
	case err := <-done:
		return fmt.Errorf("demo control plane: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	r.Stack.ControlPlane = &stackfile.ControlPlane{XDSAddr: cp.Addr().String()}
	return nil
}
