package sdsedge

import (
	"context"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/filecerts"
	"github.com/meshagent/meshagent/services/sds-edge/internal/gatewaycreds"
	"github.com/meshagent/meshagent/services/sds-edge/internal/sds"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// gatewayServer is the gateway credential server (router mode): its own store, file
// loader and SDS socket, so that nothing of the workload identity is reachable
// through it (package gatewaycreds).
type gatewayServer struct {
	e     *Edge
	store *secrets.Store
	files *filecerts.Files
	ln    *sds.Listener
}

func newGatewayServer(e *Edge) (*gatewayServer, error) {
	g := &gatewayServer{e: e, store: secrets.NewFor(gatewaycreds.Names, nil)}
	log := e.log.Named("gateway")
	// Paths reach the loader already joined under the secret root; nothing here is
	// resolved by name (no file-cert:), so no directory is open to such names.
	g.files = filecerts.New(g.store, func(p string) string { return p }, nil, e.cfg.Cert.FileDebounce, g.changed, e.d.Clock, log)
	r, err := gatewaycreds.New(e.cfg.Gateway.Dir, g.files, e.d.Metrics, log)
	if err != nil {
		return nil, err
	}
	g.store.SetResolver(r)
	g.ln = sds.NewListener(e.cfg.Gateway.Socket, e.cfg.SDS.SocketMode, sds.New(g.store, gatewayObserver{e}, e.d.Clock, log), log)
	return g, nil
}

// Bound is closed once the credential socket accepts connections.
func (g *gatewayServer) Bound() <-chan struct{} { return g.ln.Bound() }

func (g *gatewayServer) run(ctx context.Context) error {
	g.e.log.Info("serving gateway credentials", "dir", g.e.cfg.Gateway.Dir, "socket", g.e.cfg.Gateway.Socket)
	return lifecycle.Tasks(ctx, g.ln.Run, g.files.Run)
}

// changed counts a reloaded credential's pushes. Gateway credentials are not the
// pod's identity: no sds.pushed event (the fleet inventory counts identities).
func (g *gatewayServer) changed(en *secrets.Entry, streams int) {
	g.e.m.Pushes.WithLabelValues(en.Name).Add(float64(streams))
	g.e.log.Named("gateway").Info("gateway credential loaded", "name", en.Name, "version", en.Version, "streams", streams)
}

// gatewayObserver counts what the credential server does; a NACK is published as
// the workload server's are.
type gatewayObserver struct{ e *Edge }

func (o gatewayObserver) Served(node string, en *secrets.Entry) {
	o.e.m.Served.WithLabelValues(en.Name).Inc()
}

func (o gatewayObserver) Nacked(node string, names []string, version, nonce, msg string) {
	sdsObserver(o).Nacked(node, names, version, nonce, msg)
}

func (o gatewayObserver) Asked(string, []string) {}

func (o gatewayObserver) Stream(rpc string, delta int) {
	o.e.m.Connections.WithLabelValues("gateway_" + rpc).Add(float64(delta))
}

var _ sds.Observer = gatewayObserver{}
