// Package launcher is the launcher service as a library: one pod's Envoy, run the
// way Istio's pilot-agent runs it. Load reads the config, New builds the launcher
// from it and its lifecycle.Deps, Run waits until sds-edge holds the pod's
// certificates and xds-relay its upstream, writes Envoy's bootstrap, starts Envoy,
// serves the status port, and drains Envoy on shutdown. Without Envoy (none found,
// or DISABLE_ENVOY) it writes a gRPC xDS bootstrap for proxyless gRPC instead.
package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/outbox"
	"github.com/meshagent/meshagent/services/launcher/internal/config"
	"github.com/meshagent/meshagent/services/launcher/internal/envoy"
	"github.com/meshagent/meshagent/services/launcher/internal/gate"
	"github.com/meshagent/meshagent/services/launcher/internal/status"
	"github.com/meshagent/meshagent/services/launcher/internal/supervise"
	"github.com/meshagent/meshagent/services/launcher/internal/waitready"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is the launcher's configuration.
type Config = config.Config

// Load reads the config from flags and env vars.
func Load(args []string, getenv func(string) string) (Config, error) {
	return config.Load(args, getenv)
}

// Main is the launcher command: `wait [flags]` is Istio's `pilot-agent wait`
// (block until the pod's proxy is ready; exit 0 ready, 1 not), anything else the
// launcher itself (Load → Connect → New → Run).
func Main(ctx context.Context, args []string, getenv func(string) string) error {
	if len(args) > 0 && args[0] == "wait" {
		return waitready.Run(ctx, args[1:], os.Stdout)
	}
	return lifecycle.Serve(ctx, args, getenv, Load, New)
}

// EventsDropped names the counter of the launcher's events not published.
const EventsDropped = "meshagent_launcher_events_dropped_total"

// Launcher runs one pod's Envoy, or prepares its proxyless gRPC.
type Launcher struct {
	cfg   Config
	clock clock.Clock
	log   hclog.Logger
	pub   *outbox.Outbox // nil without a bus
	gate  *gate.Gate
	sup   *supervise.Supervisor // nil in proxyless mode
	// binary is the Envoy found; "" in proxyless mode.
	binary string
	why    string // why proxyless
	status *status.Server
	stop   chan supervise.Stop
	up     prometheus.Gauge
}

// New builds the launcher: it finds Envoy, parses the app probers and prepares
// the event publisher, and starts nothing.
func New(cfg Config, d lifecycle.Deps) (*Launcher, error) {
	d = d.WithDefaults()
	l := &Launcher{cfg: cfg, clock: d.Clock, log: d.Log, stop: make(chan supervise.Stop, 1)}
	switch bin, err := exec.LookPath(cfg.Envoy.Binary); {
	case cfg.Envoy.Disabled:
		l.why = "DISABLE_ENVOY is set"
	case cfg.Envoy.Binary == "":
		l.why = "no -envoy-binary"
	case err != nil:
		l.why = fmt.Sprintf("envoy binary %q not found", cfg.Envoy.Binary)
	default:
		l.binary = bin
	}
	if d.Bus != nil {
		js, err := jetstream.New(d.Bus)
		if err != nil {
			return nil, fmt.Errorf("jetstream: %w", err)
		}
		l.pub, err = outbox.New(js, outbox.Options{Source: "launcher/" + cfg.PodRef().String(), Metric: EventsDropped,
			Registry: d.Metrics, Log: d.Log.Named("events")})
		if err != nil {
			return nil, err
		}
	}
	l.gate = gate.New(gate.Config{Pod: cfg.Pod.ID, SDSSocket: cfg.SDSSocket, SDSReadyURL: cfg.SDSReadyURL, XDSSocket: cfg.XDSSocket,
		RelayReadyURL: cfg.RelayReadyURL, Wait: cfg.WaitFor}, d.Clock, d.Log.Named("gate"))
	admin := envoy.Admin{Addr: cfg.Envoy.AdminAddr}
	if l.binary != "" {
		sc, err := l.supervisorConfig(admin)
		if err != nil {
			return nil, err
		}
		var pub supervise.Publisher
		if l.pub != nil {
			pub = l.pub
		}
		l.sup = supervise.New(sc, d.Clock, d.Log.Named("envoy"), pub)
	}
	probers, err := status.ParseProbers(cfg.Status.AppProbers, cfg.Pod.IPs[0])
	if err != nil {
		return nil, err
	}
	if cfg.Listen.Status != "" {
		l.status = status.New(status.Config{Addr: cfg.Listen.Status, Ready: l.ready, Quit: l.quit, Drain: l.drain,
			EnvoyStats: l.envoyStats, Sources: cfg.Status.MetricsURLs, Gatherer: d.Metrics,
			AppMetrics: cfg.Status.AppMetricsURL, AppTimeout: cfg.Status.AppTimeout,
			MaxScrape: cfg.Status.MaxScrape, Probers: probers, Log: d.Log.Named("status")})
	}
	l.up = prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshagent_launcher_envoy_up",
		Help: "1 while Envoy's process runs (0 in proxyless mode)."})
	if err := d.Metrics.Register(l.up); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	d.Health.AddReadyCheck("envoy", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return l.ready(ctx)
	})
	return l, nil
}

// Mode says what the launcher runs: "envoy <path>" or "proxyless (<why>)".
func (l *Launcher) Mode() string {
	if l.binary != "" {
		return "envoy " + l.binary
	}
	return "proxyless (" + l.why + ")"
}

// StatusAddr is the status server's bound address, nil before it is bound or
// when it is off.
func (l *Launcher) StatusAddr() string {
	if l.status == nil || l.status.Addr() == nil {
		return ""
	}
	return l.status.Addr().String()
}

// Run runs the launcher until ctx ends (then Envoy is drained) or Envoy ends
// unasked (a *lifecycle.ExitError with Envoy's exit code, so that the pod
// restarts). The status server and the event publisher live until the drain is
// over, so that the drain itself is seen and reported.
func (l *Launcher) Run(ctx context.Context) error {
	life, end := context.WithCancel(context.WithoutCancel(ctx))
	defer end()
	tasks := []func(context.Context) error{func(context.Context) error {
		defer end()
		return l.run(ctx)
	}}
	if l.pub != nil {
		tasks = append(tasks, l.pub.Run)
	}
	if l.status != nil {
		tasks = append(tasks, l.status.Run)
	}
	return lifecycle.Tasks(life, tasks...)
}

func (l *Launcher) run(ctx context.Context) error {
	l.log.Info("launcher starting", "mode", l.Mode())
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	quit := make(chan struct{})
	go func() {
		select {
		case req := <-l.stop:
			l.stop <- req // for the supervisor, if Envoy starts after all
			close(quit)
			cancel()
		case <-gctx.Done():
		}
	}()
	if l.sup != nil {
		l.sup.Prefetch() // while the gate waits
	}
	if err := l.gate.Wait(gctx); err != nil {
		select {
		case <-quit:
			return &lifecycle.ExitError{Code: 0, Reason: "stopped on request before envoy started"}
		default:
		}
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	cancel() // the gate is passed: from here on the supervisor takes stop requests
	wctx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { l.watchParts(wctx) })
	defer watching.Wait()
	defer stopWatch()
	if l.binary == "" {
		return l.runProxyless(ctx)
	}
	if err := l.writeBootstrap(); err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		select {
		case l.stop <- supervise.Stop{Reason: "SIGTERM"}:
		default: // a stop is already asked for
		}
	}()
	l.up.Set(1)
	res, err := l.sup.Run(l.stop)
	l.up.Set(0)
	if err != nil {
		return err
	}
	switch {
	case res.Crashed:
		return &lifecycle.ExitError{Code: exitCode(res.Exit), Reason: "envoy exited unasked: " + res.Exit.String()}
	case ctx.Err() == nil:
		l.log.Info("envoy stopped on request", "exit", res.Exit.String(), "drain", res.Drain)
		return &lifecycle.ExitError{Code: 0, Reason: "stopped on request"}
	default:
		l.log.Info("envoy stopped", "exit", res.Exit.String(), "drain", res.Drain, "active_connections", res.Active)
		return nil
	}
}

// exitCode is what the launcher exits with after Envoy: its code, or 128 + the
// signal's number, as a shell reports it; never 0 for a crash.
func exitCode(e envoy.Exit) int {
	if e.Signal != "" {
		for n := syscall.Signal(1); n < 65; n++ {
			if n.String() == e.Signal {
				return 128 + int(n)
			}
		}
		return 128
	}
	if e.Code <= 0 {
		return 1
	}
	return e.Code
}

// ready is the pod's readiness: Envoy LIVE (or, proxyless, the certificate files),
// and sds-edge's certificates and the relay still there.
func (l *Launcher) ready(ctx context.Context) error {
	var errs []error
	if l.sup != nil {
		if err := l.sup.Ready(); err != nil {
			errs = append(errs, err)
		} else if err := (envoy.Admin{Addr: l.cfg.Envoy.AdminAddr}).Ready(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if err := l.proxylessReady(); err != nil {
		errs = append(errs, err)
	}
	for _, m := range l.gate.Recent(ctx, 30*time.Second) {
		errs = append(errs, errors.New("missing "+m))
	}
	return errors.Join(errs...)
}

// quit is /quitquitquit: stop Envoy at once and exit.
func (l *Launcher) quit() {
	select {
	case l.stop <- supervise.Stop{Reason: "/quitquitquit", Now: true}:
	default:
	}
}

// drain is /drain: drain Envoy's listeners, keep running, report not ready.
func (l *Launcher) drain(ctx context.Context) error {
	if l.sup == nil || !l.sup.Running() {
		return errors.New("no envoy running")
	}
	return l.sup.DrainListeners(ctx)
}

func (l *Launcher) envoyStats() string {
	if l.sup == nil || !l.sup.Running() {
		return ""
	}
	return "http://" + l.cfg.Envoy.AdminAddr + "/stats/prometheus"
}
