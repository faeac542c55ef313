// Package workloadhealth is Istio's workload health checking (pkg/istio-agent/health):
// the agent probes the app as ProxyConfig's readinessProbe says, after Envoy is
// ready, and reports each change of health, decided by the probe's success and
// failure thresholds, to the control plane, which marks the workload's
// WorkloadEntry Healthy or not. It reports changes only, never a heartbeat.
package workloadhealth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/appprobe"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv/istioenv"
)

// UserAgent is the probes' HTTP User-Agent, Istio's agent's.
const UserAgent = "istio-probe/1.0"

// Config is what the checker probes.
type Config struct {
	Probe istioenv.ReadinessProbe
	// Host is where a probe that names no host goes: the workload's first IP
	// (INSTANCE_IP), as Istio's agent probes, else localhost.
	Host string
	// EnvoyAdmin is Envoy's admin host:port; while its /ready does not answer 200
	// the workload is unhealthy (Istio's agent probes Envoy first). Empty: no Envoy.
	EnvoyAdmin string
}

// Settings are the probe's timing and thresholds with Istio's defaults filled
// in (fillInDefaults): a 1 s timeout, a 10 s period, thresholds of 1; the
// initial delay may be zero.
type Settings struct {
	InitialDelay, Timeout, Period time.Duration
	SuccessThreshold              int
	FailureThreshold              int
}

// SettingsOf is p's settings as Istio's agent reads them.
func SettingsOf(p istioenv.ReadinessProbe) Settings {
	or := func(v, def int32) int32 {
		if v == 0 {
			return def
		}
		return v
	}
	return Settings{
		InitialDelay:     time.Duration(p.InitialDelaySeconds) * time.Second,
		Timeout:          time.Duration(or(p.TimeoutSeconds, 1)) * time.Second,
		Period:           time.Duration(or(p.PeriodSeconds, 10)) * time.Second,
		SuccessThreshold: int(or(p.SuccessThreshold, 1)),
		FailureThreshold: int(or(p.FailureThreshold, 1)),
	}
}

// Report receives a change of health: healthy, or not with the failed probe's message.
type Report func(healthy bool, message string)

// Prober runs one probe: nil means healthy.
type Prober func(ctx context.Context) error

// Checker probes the workload and reports changes of its health.
type Checker struct {
	set    Settings
	probe  Prober
	clock  clock.Clock
	report Report
	log    hclog.Logger
}

// New returns a checker of cfg's probe; it probes nothing until Run.
func New(cfg Config, clk clock.Clock, report Report, log hclog.Logger) (*Checker, error) {
	p, err := Probe(cfg)
	if err != nil {
		return nil, err
	}
	return NewWithProber(SettingsOf(cfg.Probe), p, clk, report, log), nil
}

// NewWithProber is New with the probe given (tests).
func NewWithProber(set Settings, p Prober, clk clock.Clock, report Report, log hclog.Logger) *Checker {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Checker{set: set, probe: p, clock: clk, report: report, log: log}
}

// Run waits the initial delay, then probes at once and every period until ctx
// ends, and returns nil then. The first report is sent when a threshold is
// first reached (healthy after SuccessThreshold successes in a row, unhealthy
// after FailureThreshold failures in a row), and then on each change, as
// Istio's agent counts them (PerformApplicationHealthCheck).
func (c *Checker) Run(ctx context.Context) error {
	c.log.Info("workload health checks starting", "initial_delay", c.set.InitialDelay, "period", c.set.Period,
		"success_threshold", c.set.SuccessThreshold, "failure_threshold", c.set.FailureThreshold)
	t := c.clock.NewTimer(c.set.InitialDelay)
	defer t.Stop()
	var s state
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		pctx, cancel := context.WithTimeout(ctx, c.set.Timeout)
		err := c.probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if healthy, msg, changed := s.observe(c.set, err); changed {
			if healthy {
				c.log.Info("workload healthy: success threshold reached")
			} else {
				c.log.Info("workload unhealthy: failure threshold reached", "error", msg)
			}
			c.report(healthy, msg)
		} else if err != nil {
			c.log.Debug("probe failed", "error", err)
		}
		t.Reset(c.set.Period)
	}
}

// state counts consecutive results since the last report.
type state struct {
	successes, failures int
	last                int // 0 none reported yet, 1 healthy, 2 unhealthy
}

// observe counts one probe result (err nil: success) and says whether it
// changes the reported health, and to what.
func (s *state) observe(set Settings, err error) (healthy bool, msg string, changed bool) {
	if err == nil {
		s.successes++
		s.failures = 0
		if s.successes >= set.SuccessThreshold && s.last != 1 {
			s.successes, s.last = 0, 1
			return true, "", true
		}
		return false, "", false
	}
	s.failures++
	s.successes = 0
	if s.failures >= set.FailureThreshold && s.last != 2 {
		s.failures, s.last = 0, 2
		return false, err.Error(), true
	}
	return false, "", false
}

// Probe is cfg's prober: Envoy's readiness first (when cfg names its admin),
// then the app by the probe's one method.
func Probe(cfg Config) (Prober, error) {
	host := cfg.Host
	if host == "" {
		host = "localhost"
	}
	p := cfg.Probe
	var app Prober
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		hs := make([]appprobe.Header, len(g.Headers))
		for i, h := range g.Headers {
			hs[i] = appprobe.Header{Name: h.Name, Value: h.Value}
		}
		get := appprobe.HTTPGet{Scheme: g.Scheme, Host: g.Host, Port: int(g.Port), Path: g.Path, Headers: hs, UserAgent: UserAgent}
		if get.Host == "" {
			get.Host = host
		}
		app = func(ctx context.Context) error {
			code, err := appprobe.HTTP(ctx, get)
			if errors.Is(err, appprobe.ErrStatus) {
				return fmt.Errorf("status code was not from [200,400), bad code %d", code)
			}
			return err
		}
	case p.TCPSocket != nil:
		h := p.TCPSocket.Host
		if h == "" {
			h = host
		}
		port := int(p.TCPSocket.Port)
		app = func(ctx context.Context) error { return appprobe.TCP(ctx, h, port) }
	case p.Exec != nil:
		cmd := p.Exec.Command
		app = func(ctx context.Context) error { return appprobe.Exec(ctx, cmd) }
	case p.GRPC != nil:
		port, svc := int(p.GRPC.Port), p.GRPC.Service
		app = func(ctx context.Context) error { return appprobe.GRPC(ctx, host, port, svc) }
	default:
		return nil, errors.New("readiness probe: no method (httpGet, tcpSocket, exec or grpc)")
	}
	if cfg.EnvoyAdmin == "" {
		return app, nil
	}
	h, portS, err := net.SplitHostPort(cfg.EnvoyAdmin)
	if err != nil {
		return nil, fmt.Errorf("envoy admin %q: %w", cfg.EnvoyAdmin, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return nil, fmt.Errorf("envoy admin %q: port: %w", cfg.EnvoyAdmin, err)
	}
	ready := appprobe.HTTPGet{Host: h, Port: port, Path: "/ready", UserAgent: UserAgent}
	return func(ctx context.Context) error {
		if code, err := appprobe.HTTP(ctx, ready); err != nil {
			if code != 0 {
				return fmt.Errorf("envoy not ready: admin /ready answered %d", code)
			}
			return fmt.Errorf("envoy not ready: %w", err)
		}
		return app(ctx)
	}, nil
}
