// Package supervise runs one Envoy from start to exit: it starts the process,
// watches its admin /ready, and on a stop request drains it as Istio's agent does —
// POST /drain_listeners?graceful (inbound only for a sidecar), then either
// TERMINATION_DRAIN_DURATION or, with EXIT_ON_ZERO_ACTIVE_CONNECTIONS, at least
// MINIMUM_DRAIN_DURATION and then until downstream_cx_active is zero — all within
// one hard deadline, after which Envoy is killed. A crash (Envoy ending unasked) is
// reported with its exit code or signal. Every step is an event.
package supervise

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/launcher/internal/envoy"
)

// Publisher sends the pod's events (pkg/outbox in the service).
type Publisher interface {
	Publish(subject string, payload events.Payload)
}

// Config says how to run and drain Envoy.
type Config struct {
	Pod         events.PodRef
	Spec        envoy.Spec
	Admin       envoy.Admin
	InboundOnly bool     // drain inbound listeners only (a sidecar)
	Exclude     []string // listeners left out of downstream_cx_active (the stats listener)
	Drain       Drain
	ReadyEvery  time.Duration // admin /ready poll, at most (the first come sooner); 0: 200ms
}

// Drain is the drain policy.
type Drain struct {
	Duration     time.Duration // TERMINATION_DRAIN_DURATION
	ExitOnZero   bool          // EXIT_ON_ZERO_ACTIVE_CONNECTIONS
	MinDuration  time.Duration // MINIMUM_DRAIN_DURATION
	PollInterval time.Duration
	Deadline     time.Duration // the hard bound; Envoy is killed after it
}

// Stop is how the launcher asks Envoy to stop.
type Stop struct {
	Reason string // "SIGTERM", "/quitquitquit", ...
	Now    bool   // /quitquitquit: no drain wait, stop at once
}

// Result is how Envoy ended.
type Result struct {
	Exit    envoy.Exit
	Crashed bool   // ended unasked
	Drain   string // events.Drain*
	Active  int    // last downstream_cx_active seen (-1: not polled)
}

// Supervisor runs one Envoy.
type Supervisor struct {
	cfg   Config
	clock clock.Clock
	log   hclog.Logger
	pub   Publisher

	mu       sync.Mutex
	proc     *envoy.Process
	ready    atomic.Bool
	draining atomic.Bool
	// deadlineFired: the drain deadline has passed (only the drain goroutine).
	deadlineFired bool
	// version is `envoy --version`'s first line, asked once per supervisor: a
	// second process per pod start, so Prefetch asks it while the pod still waits
	// at the gate, and every (re)start reuses it.
	version func() string
}

// New returns a supervisor; nothing starts until Run. pub may be nil (no events).
func New(cfg Config, clk clock.Clock, log hclog.Logger, pub Publisher) *Supervisor {
	if cfg.ReadyEvery <= 0 {
		cfg.ReadyEvery = 200 * time.Millisecond
	}
	s := &Supervisor{cfg: cfg, clock: clk, log: log, pub: pub}
	s.version = sync.OnceValue(func() string { return envoy.Version(context.Background(), cfg.Spec.Binary) })
	return s
}

// Prefetch asks Envoy's version in the background now, so that Run does not wait
// for it.
func (s *Supervisor) Prefetch() { go s.version() }

// Ready reports nil when Envoy has been LIVE and is not draining.
func (s *Supervisor) Ready() error {
	switch {
	case s.draining.Load():
		return fmt.Errorf("envoy draining")
	case !s.ready.Load():
		return fmt.Errorf("envoy not ready yet")
	}
	return nil
}

// Running reports whether Envoy's process is up.
func (s *Supervisor) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return false
	}
	select {
	case <-s.proc.Exited():
		return false
	default:
		return true
	}
}

// DrainListeners drains Envoy's listeners without stopping it (the status port's
// /drain): the pod reports not ready from now on.
func (s *Supervisor) DrainListeners(ctx context.Context) error {
	s.draining.Store(true)
	return s.cfg.Admin.DrainListeners(ctx, s.cfg.InboundOnly)
}

func (s *Supervisor) publish(kind string, p events.Payload) {
	if s.pub == nil {
		return
	}
	subj, err := events.PodEventSubject(s.cfg.Pod, kind)
	if err != nil {
		s.log.Error("event subject", "error", err)
		return
	}
	s.pub.Publish(subj, p)
}

// Run starts Envoy and supervises it until it ends: by itself (a crash, Crashed
// set) or after a request on stop, drained as configured. An error means Envoy
// could not be started.
func (s *Supervisor) Run(stop <-chan Stop) (Result, error) {
	version := s.version()
	p, err := envoy.Start(s.cfg.Spec)
	if err != nil {
		return Result{}, err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	start := s.clock.Now()
	s.log.Info("envoy started", "pid", p.PID(), "binary", s.cfg.Spec.Binary, "version", version)
	s.publish(events.PodEventEnvoyStarted, events.EnvoyStarted{Pod: s.cfg.Pod, PID: p.PID(), Version: version,
		Binary: s.cfg.Spec.Binary, Args: s.cfg.Spec.Args})

	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	go s.watchReady(watchCtx, p, start)

	var res Result
	var drainTook time.Duration
	select {
	case <-p.Exited():
		res = Result{Exit: p.Exit(), Crashed: true, Drain: events.DrainNone, Active: -1}
		s.log.Error("envoy exited unasked", "pid", p.PID(), "exit", res.Exit.String())
	case req := <-stop:
		stopWatch()
		began := s.clock.Now()
		res = s.drain(p, req)
		drainTook = s.clock.Now().Sub(began)
	}
	s.ready.Store(false)
	s.publish(events.PodEventEnvoyExited, events.EnvoyExited{Pod: s.cfg.Pod, PID: p.PID(), Code: res.Exit.Code,
		Signal: res.Exit.Signal, Crashed: res.Crashed, Drain: res.Drain, ActiveConnections: res.Active,
		DrainMillis: drainTook.Milliseconds()})
	return res, nil
}

// watchReady polls admin /ready (sooner at first) until Envoy is LIVE once, then
// reports it.
func (s *Supervisor) watchReady(ctx context.Context, p *envoy.Process, start time.Time) {
	lastLog := start
	// Envoy is usually LIVE within tens of milliseconds: ask soon, then every
	// ReadyEvery at most.
	poll := backoff.Policy{First: min(10*time.Millisecond, s.cfg.ReadyEvery), Max: s.cfg.ReadyEvery}.Start()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := s.cfg.Admin.Ready(rctx)
		cancel()
		if err == nil {
			if s.draining.Load() {
				return
			}
			s.ready.Store(true)
			took := s.clock.Now().Sub(start)
			s.log.Info("envoy ready", "pid", p.PID(), "after", took.Round(time.Millisecond))
			s.publish(events.PodEventEnvoyReady, events.EnvoyReady{Pod: s.cfg.Pod, PID: p.PID(), StartupMillis: took.Milliseconds()})
			return
		}
		if now := s.clock.Now(); now.Sub(lastLog) >= 5*time.Second {
			s.log.Info("waiting for envoy to be ready", "pid", p.PID(), "state", err.Error())
			lastLog = now
		}
		t := s.clock.NewTimer(poll.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.Exited():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// drain runs the drain for req and stops Envoy; it always returns with Envoy gone.
func (s *Supervisor) drain(p *envoy.Process, req Stop) Result {
	d := s.cfg.Drain
	s.draining.Store(true)
	strategy := events.DrainDuration
	if d.ExitOnZero {
		strategy = events.DrainZeroConnections
	}
	deadline := s.clock.NewTimer(d.Deadline)
	defer deadline.Stop()
	res := Result{Active: -1}
	if req.Now {
		s.log.Info("stopping envoy now", "reason", req.Reason, "pid", p.PID())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := s.cfg.Admin.Quit(ctx); err != nil {
			// A quit that did take may still read as failed: Envoy can close the
			// admin connection as it exits. Give it a moment before signalling.
			t := s.clock.NewTimer(time.Second)
			select {
			case <-p.Exited():
			case <-t.C():
				s.log.Warn("envoy quitquitquit failed; sending SIGTERM", "error", err)
				p.Signal(syscall.SIGTERM)
			}
			t.Stop()
		}
		cancel()
		res.Drain = events.DrainQuit
		return s.await(p, deadline, res)
	}
	s.log.Info("draining envoy", "reason", req.Reason, "pid", p.PID(), "strategy", strategy, "deadline", d.Deadline)
	s.publish(events.PodEventEnvoyDraining, events.EnvoyDraining{Pod: s.cfg.Pod, PID: p.PID(), Strategy: strategy,
		DeadlineMillis: d.Deadline.Milliseconds(), Reason: req.Reason})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := s.cfg.Admin.DrainListeners(ctx, s.cfg.InboundOnly); err != nil {
		s.log.Warn("drain_listeners failed", "error", err)
	}
	cancel()

	wait := d.Duration
	if d.ExitOnZero {
		wait = d.MinDuration
	}
	res.Drain = events.DrainElapsed
	if !s.sleep(p, deadline, wait) {
		return s.ended(p, res)
	}
	if d.ExitOnZero {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			n, err := s.cfg.Admin.ActiveConnections(ctx, s.cfg.Exclude...)
			cancel()
			if err != nil {
				s.log.Warn("reading active connections failed", "error", err)
			} else {
				res.Active = n
				if n == 0 {
					res.Drain = events.DrainZeroReached
					s.log.Info("no active connections left", "pid", p.PID())
					break
				}
				s.log.Debug("active connections", "count", n)
			}
			if !s.sleep(p, deadline, d.PollInterval) {
				return s.ended(p, res)
			}
		}
	}
	p.Signal(syscall.SIGTERM)
	return s.await(p, deadline, res)
}

// sleep waits for d; false when Envoy exited or the deadline passed first (the
// caller then ends the drain through ended).
func (s *Supervisor) sleep(p *envoy.Process, deadline clock.Timer, d time.Duration) bool {
	t := s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-p.Exited():
		return false
	case <-deadline.C():
		s.deadlineFired = true
		return false
	}
}

// ended finishes a drain cut short: Envoy exited by itself, or the deadline passed
// and it is killed.
func (s *Supervisor) ended(p *envoy.Process, res Result) Result {
	select {
	case <-p.Exited():
		if !s.deadlineFired {
			res.Drain = events.DrainEnvoyExited
			res.Exit = p.Exit()
			return res
		}
	default:
	}
	return s.kill(p, res)
}

// await waits for Envoy to exit after it was told to, killing it at the deadline.
func (s *Supervisor) await(p *envoy.Process, deadline clock.Timer, res Result) Result {
	select {
	case <-p.Exited():
		res.Exit = p.Exit()
		return res
	case <-deadline.C():
		s.deadlineFired = true
		return s.kill(p, res)
	}
}

func (s *Supervisor) kill(p *envoy.Process, res Result) Result {
	s.log.Warn("drain deadline passed: killing envoy", "pid", p.PID(), "deadline", s.cfg.Drain.Deadline)
	p.Signal(syscall.SIGKILL)
	res.Exit = p.Exit()
	res.Drain = events.DrainDeadline
	return res
}
