// Package service wires xds-relay's parts together: the bus, sds-edge's
// certificate (for mTLS), the upstream dialer, the ProxyConfig handler, the event
// publisher, the trust follower, the relay and the health/metrics server.
package service

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/outbox"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/xds-relay/internal/config"
	"github.com/meshagent/meshagent/services/xds-relay/internal/proxyconfig"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/trust"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// Run runs the relay until ctx ends; it returns nil on cancellation.
func Run(ctx context.Context, cfg config.Config, log hclog.Logger) error {
	nc, err := bus.Connect(ctx, cfg.Bus, log.Named("bus"))
	if err != nil {
		return err
	}
	defer func() { _ = nc.Drain() }()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	http := obs.NewServer(cfg.Listen.HTTP, log.Named("http"))
	var (
		mat     upstream.Material
		changes trust.Changes
		watcher *sdsclient.Watcher
	)
	if cfg.NeedsSDS() {
		cc, err := sdsclient.DialUnix(ctx, cfg.SDSSocket)
		if err != nil {
			return fmt.Errorf("sds-edge at %s: %w", cfg.SDSSocket, err)
		}
		defer cc.Close()
		watcher = sdsclient.NewWatcher(cc, "xds-relay~"+cfg.Pod.ID, log.Named("sds"))
		mat, changes = watcher, watcher
	}
	dialer, err := upstream.New(upstream.Config{Address: cfg.Upstream.Address, Mode: cfg.Upstream.Mode,
		RootCAFile: cfg.Upstream.RootCA, ServerName: cfg.Upstream.ServerName, TokenFile: cfg.Upstream.TokenFile,
		ClusterID: cfg.Upstream.ClusterID, Headers: cfg.Upstream.Headers, MaxMsgSize: cfg.MaxMsgSize,
		ConnectTimeout: cfg.Upstream.ConnectTimeout}, mat, log.Named("upstream"))
	if err != nil {
		return err
	}
	defer dialer.Close()
	pc, err := proxyconfig.New(cfg.Pod.ID, nc, dialer, log.Named("proxyconfig"))
	if err != nil {
		return err
	}
	pub, err := outbox.New(js, outbox.Options{Source: "xds-relay/" + cfg.Pod.ID, Metric: relay.EventsDropped,
		Registry: http.Registry(), Log: log.Named("events")})
	if err != nil {
		return err
	}
	r, err := relay.New(relay.Config{Pod: cfg.Pod.ID, Socket: cfg.Socket, MaxMsgSize: cfg.MaxMsgSize},
		dialer, []relay.Handler{pc}, pub, http.Registry(), log.Named("relay"))
	if err != nil {
		return err
	}
	http.AddReadyCheck("xds-socket", r.Ready)
	g, ctx := errgroup.WithContext(ctx)
	if watcher != nil {
		g.Go(func() error { return watcher.Run(ctx) })
	}
	g.Go(func() error { return http.Run(ctx) })
	g.Go(func() error { return pub.Run(ctx) })
	g.Go(func() error { return trust.New(nc, dialer, changes, log.Named("trust")).Run(ctx) })
	g.Go(func() error { return r.Run(ctx) })
	return g.Wait()
}
