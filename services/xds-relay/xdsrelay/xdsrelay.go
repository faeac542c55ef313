// Package xdsrelay is the xds-relay service, importable: it relays Envoy's ADS
// stream from a unix socket in the pod to the upstream discovery server with the
// workload certificate from sds-edge, keeps the upstream TLS current as the mesh's
// roots change, hands ProxyConfig's trust anchors to sds-edge, and reports what it
// relays as events. With DNS capture (ISTIO_META_DNS_CAPTURE) it also takes the
// control plane's name table and serves the pod's DNS proxy from it. ECDS Wasm
// filters that load a remote module are rewritten to a local file it downloaded
// and cached (internal/wasm, Istio's Wasm remote load). Its debug tap (Istio's
// PROXY_XDS_DEBUG_VIA_AGENT, localhost:15004) answers istio.io/debug questions by
// asking the discovery server on Envoy's ADS stream. With ProxyConfig's
// readinessProbe it probes the app and reports its health to the discovery server
// (internal/workloadhealth, Istio's workload health checks). It is built and run the one way every meshagent service is
// (pkg/lifecycle): Load → New(cfg, Deps) → Run.
package xdsrelay

import (
	"context"
	"errors"
	"fmt"

	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/outbox"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/xds-relay/internal/config"
	"github.com/meshagent/meshagent/services/xds-relay/internal/debugtap"
	"github.com/meshagent/meshagent/services/xds-relay/internal/dnsproxy"
	"github.com/meshagent/meshagent/services/xds-relay/internal/proxyconfig"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/tlsrefresh"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/services/xds-relay/internal/wasm"
	"github.com/meshagent/meshagent/services/xds-relay/internal/workloadhealth"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is xds-relay's whole configuration.
type Config = config.Config

// Load reads the configuration from flags and env vars over the defaults,
// resolves paths under the pod root and validates it (config.Load says where the
// XDS_HEADER_* variables come from).
func Load(args []string, getenv func(string) string) (Config, error) {
	return config.Load(args, getenv)
}

// Relay is one pod's xds-relay.
type Relay struct {
	sds    *sdsclient.Watcher // nil: the upstream needs nothing from sds-edge
	dialer *upstream.Dialer
	reach  *upstream.Reachability
	events *outbox.Outbox
	tls    *tlsrefresh.Refresher
	relay  *relay.Server
	dns    *dnsproxy.Server        // nil without DNS capture
	wasm   *wasm.Cache             // nil without the Wasm remote load
	tap    *debugtap.Server        // nil with -debug-tap=false
	health *workloadhealth.Checker // nil without a readinessProbe
}

// New builds the relay on d.Bus (required): it registers its metrics on
// d.Metrics and its readiness on d.Health (the ADS socket bound, and the
// discovery server reached once: upstream.Reachability), and neither dials
// sds-edge or the upstream nor binds the socket until Run.
func New(cfg Config, d lifecycle.Deps) (*Relay, error) {
	d = d.WithDefaults()
	if d.Bus == nil {
		return nil, errors.New("xds-relay: no bus connection")
	}
	js, err := jetstream.New(d.Bus)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	x := &Relay{}
	var (
		mat     upstream.Material
		changes tlsrefresh.Changes
		trusted tlsrefresh.Trusted
	)
	if cfg.NeedsSDS() {
		x.sds = sdsclient.WatchUnix(cfg.SDSSocket, "xds-relay~"+cfg.Pod.ID, d.Log.Named("sds"))
		mat, changes, trusted = x.sds, x.sds, x.sds
	}
	x.dialer, err = upstream.New(upstream.Config{Address: cfg.Upstream.Address, Mode: cfg.Upstream.Mode,
		RootCAFile: cfg.Upstream.RootCA, ServerName: cfg.Upstream.ServerName, TokenFile: cfg.Upstream.TokenFile,
		ClusterID: cfg.Upstream.ClusterID, Headers: cfg.Upstream.Headers, MaxMsgSize: cfg.MaxMsgSize,
		ConnectTimeout: cfg.Upstream.ConnectTimeout}, mat, d.Log.Named("upstream"))
	if err != nil {
		return nil, err
	}
	pc, err := proxyconfig.New(cfg.PodRef(), d.Bus, x.dialer, d.Log.Named("proxyconfig"))
	if err != nil {
		return nil, err
	}
	x.events, err = outbox.New(js, outbox.Options{Source: "xds-relay/" + cfg.PodRef().String(), Metric: relay.EventsDropped,
		Registry: d.Metrics, Log: d.Log.Named("events")})
	if err != nil {
		return nil, err
	}
	handlers := []relay.Handler{pc}
	if cfg.DNS.Capture {
		// The relay hosts the DNS proxy because it holds the name table: the table
		// arrives on its ADS stream, and a second process would need it passed on.
		x.dns, err = dnsproxy.New(dnsproxy.Config{Addr: cfg.DNS.Addr, ResolvConf: cfg.DNS.ResolvConf,
			Namespace: cfg.DNS.Namespace}, d.Metrics, d.Log.Named("dns"))
		if err != nil {
			return nil, err
		}
		handlers = append(handlers, x.dns.Handler())
	}
	rcfg := relay.Config{Pod: cfg.PodRef(), Socket: cfg.Socket, MaxMsgSize: cfg.MaxMsgSize}
	if cfg.Wasm.RemoteLoad {
		w := cfg.Wasm
		x.wasm, err = wasm.NewCache(wasm.Options{Dir: w.Dir, ModuleExpiry: w.ModuleExpiry, PurgeInterval: w.PurgeInterval,
			RequestTimeout: w.RequestTimeout, MaxAttempts: w.MaxAttempts, InsecureRegistries: w.InsecureRegistries,
			MaxBytes: int64(w.MaxBytes)}, d.Clock, d.Metrics, d.Log.Named("wasm"))
		if err != nil {
			return nil, err
		}
		rcfg.Rewriters = append(rcfg.Rewriters, wasm.NewRewriter(x.wasm, d.Log.Named("wasm")))
	}
	x.relay, err = relay.New(rcfg,
		x.dialer, handlers, x.events, d.Metrics, d.Log.Named("relay"))
	if err != nil {
		return nil, err
	}
	if cfg.DebugTap.Enabled {
		x.tap, err = debugtap.New(debugtap.Config{Addr: cfg.DebugTapAddr()}, x.relay, d.Log.Named("debugtap"))
		if err != nil {
			return nil, err
		}
	}
	if cfg.Health.Probe != nil {
		host := ""
		if len(cfg.Health.IPs) > 0 {
			host = cfg.Health.IPs[0]
		}
		x.health, err = workloadhealth.New(workloadhealth.Config{Probe: *cfg.Health.Probe, Host: host, EnvoyAdmin: cfg.Health.EnvoyAdmin},
			d.Clock, func(healthy bool, msg string) { x.relay.ReportHealth(relay.Health{Healthy: healthy, Message: msg}) },
			d.Log.Named("health"))
		if err != nil {
			return nil, err
		}
	}
	x.reach, err = upstream.NewReachability(x.dialer, d.Metrics, d.Clock, d.Log.Named("upstream"))
	if err != nil {
		return nil, err
	}
	x.tls = tlsrefresh.New(d.Bus, x.dialer, changes, trusted, d.Log.Named("trust"))
	d.Health.AddReadyCheck("xds-socket", x.relay.Ready)
	d.Health.AddReadyCheck("upstream", x.reach.Ready)
	if x.dns != nil {
		d.Health.AddReadyCheck("dns-proxy", x.dns.Ready)
	}
	if x.tap != nil {
		d.Health.AddReadyCheck("debug-tap", x.tap.Ready)
	}
	return x, nil
}

// Run follows sds-edge (when the upstream needs its certificate or roots), serves
// the ADS socket, keeps the upstream connected and reports whether it is,
// publishes events and keeps the upstream TLS current, until ctx ends; it
// returns nil then.
func (x *Relay) Run(ctx context.Context) error {
	defer x.dialer.Close()
	tasks := []func(context.Context) error{x.events.Run, x.tls.Run, x.relay.Run, x.reach.Run}
	if x.sds != nil {
		tasks = append(tasks, x.sds.Run)
	}
	if x.dns != nil {
		tasks = append(tasks, x.dns.Run)
	}
	if x.wasm != nil {
		tasks = append(tasks, x.wasm.Run)
	}
	if x.tap != nil {
		tasks = append(tasks, x.tap.Run)
	}
	if x.health != nil {
		tasks = append(tasks, x.health.Run)
	}
	return lifecycle.Tasks(ctx, tasks...)
}
