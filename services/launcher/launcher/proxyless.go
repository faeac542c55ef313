package launcher

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/launcher/internal/proxyless"
)

// runProxyless writes the gRPC xDS bootstrap and waits for ctx: the app reads the
// bootstrap (GRPC_XDS_BOOTSTRAP), gets its config through xds-relay and its mTLS
// certificates from sds-edge's OUTPUT_CERTS files.
func (l *Launcher) runProxyless(ctx context.Context) error {
	n := l.node()
	b := proxyless.Build(proxyless.Params{NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: n.Metadata(),
		XDSSocket: l.cfg.XDSSocket, CertDir: l.cfg.OutputCerts, Refresh: l.cfg.CertRefresh})
	if err := proxyless.Write(l.cfg.GRPCBootstrap, b); err != nil {
		return err
	}
	l.log.Info("proxyless: gRPC xDS bootstrap written", "path", l.cfg.GRPCBootstrap, "certs", l.cfg.OutputCerts,
		"node", n.ID(), "why", l.why)
	select {
	case <-ctx.Done():
		return nil
	case req := <-l.stop:
		return &lifecycle.ExitError{Code: 0, Reason: "stopped on request (" + req.Reason + ")"}
	}
}

func (l *Launcher) proxylessReady() error { return proxyless.CertsPresent(l.cfg.OutputCerts) }
