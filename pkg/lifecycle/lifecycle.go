// Package lifecycle is the one way every meshagent service is built, started and
// stopped:
//
//	Load(args, getenv) → health server up → Connect (bus, if the config names one) → New(cfg, Deps) → Run(ctx)
//
// A service package exports Load, New and Run; its main.go hands them to Serve.
// Constructors only build: they neither listen nor start goroutines. Run runs the
// service's task list through Tasks and returns nil when ctx is cancelled. Serve
// adds the process's health and metrics server and the bus connection around it,
// and Main turns the outcome into an exit code.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/buildinfo"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Deps are a service's runtime dependencies: what New takes besides its config.
type Deps struct {
	Bus     *nats.Conn // nil for a service whose config names no bus
	Clock   clock.Clock
	Log     hclog.Logger
	Metrics *prometheus.Registry
	Health  Health
	// Routes mounts a service's own HTTP handlers (a page, an API) on the listener
	// of /healthz, /readyz and /metrics; most services mount nothing.
	Routes Routes
}

// WithDefaults fills what d leaves nil: the real clock, a logger that drops
// everything, a fresh metrics registry and a health server that is never run.
// Tests and a binary hosting several services build their Deps with it.
func (d Deps) WithDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clock.Real{}
	}
	if d.Log == nil {
		d.Log = hclog.NewNullLogger()
	}
	if d.Metrics == nil {
		d.Metrics = prometheus.NewRegistry()
	}
	if d.Health == nil {
		srv := obs.NewServer("", d.Log)
		d.Health = srv
		if d.Routes == nil {
			d.Routes = srv
		}
	}
	if d.Routes == nil {
		d.Routes = obs.NewServer("", d.Log)
	}
	return d
}

// Routes is where a service mounts HTTP handlers of its own beside the health and
// metrics endpoints (obs.Server.Handle).
type Routes interface {
	Handle(pattern string, h http.Handler)
	// Use wraps everything the listener serves, health and metrics included (the
	// operator's Host check, against DNS rebinding).
	Use(mw func(http.Handler) http.Handler)
}

// Health is where a service registers its readiness checks (/readyz).
type Health interface {
	AddReadyCheck(name string, c obs.Check)
}

// Service is what a service's New returns.
type Service interface {
	Run(ctx context.Context) error
}

// Process is the part of a service's config that the lifecycle itself reads.
type Process struct {
	Name    string        // the service's name: logger name and error prefix
	Log     obs.LogConfig // level and format of the root logger
	LogWith []any         // key/value pairs on every log line (e.g. the pod)
	HTTP    string        // listen address of /healthz, /readyz and /metrics
	Bus     *bus.Config   // nil: the service has no bus connection
}

// Config is what every service's config provides to the lifecycle.
type Config interface {
	Process() Process
}

// Loader reads a service's config from its flags and environment and validates it.
type Loader[C Config] func(args []string, getenv func(string) string) (C, error)

// Builder builds a service from its config and dependencies, without starting it.
type Builder[C Config, S Service] func(cfg C, d Deps) (S, error)

// Main runs a whole service process: it cancels on SIGINT or SIGTERM, prints the
// flags for -h, and exits 1 with "<name>: <error>" when run fails.
func Main(name string, run func(ctx context.Context, args []string, getenv func(string) string) error) {
	if buildinfo.Asked(os.Args[1:]) { // -version, or the word version
		fmt.Fprintln(os.Stdout, buildinfo.String(name))
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], flagenv.OS)
	stop()
	os.Exit(exitCode(name, err, os.Stdout, os.Stderr))
}

// exitCode reports err the way Main does and returns the process's exit code.
func exitCode(name string, err error, stdout, stderr io.Writer) int {
	var exit *ExitError
	switch {
	case err == nil:
		return 0
	case flagenv.PrintHelp(err, stdout):
		return 0 // -h: the flags, their env vars and defaults
	case errors.As(err, &exit):
		if exit.Code != 0 {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
		}
		return exit.Code
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}

// ExitError ends the process with its own exit code: a service that stops because
// a child it supervises ended (the launcher when Envoy crashes: the same code, so
// the pod restarts), or because it was asked to (Code 0: /quitquitquit). Returned
// from Run it also stops the process's other tasks, which a nil return does not.
type ExitError struct {
	Code   int
	Reason string
}

func (e *ExitError) Error() string { return e.Reason }

// Serve is a service's whole life: Load its config, connect to the bus if it has
// one, build it with New, and run it beside the health and metrics server until
// ctx ends. Cancelling ctx at any point, even while waiting for the bus, is a
// clean stop and returns nil. Logs go to stderr.
func Serve[C Config, S Service](ctx context.Context, args []string, getenv func(string) string,
	load Loader[C], build Builder[C, S]) error {
	return serve(ctx, args, getenv, load, build, os.Stderr, nil, nil)
}

// ServeShared is Serve for a service hosted beside others in one process: its bus
// connection is shared through shared with those whose bus configs allow it (nil:
// Serve).
func ServeShared[C Config, S Service](ctx context.Context, shared *SharedBus, args []string, getenv func(string) string,
	load Loader[C], build Builder[C, S]) error {
	if shared == nil {
		return Serve(ctx, args, getenv, load, build)
	}
	return serve(ctx, args, getenv, load, build, os.Stderr, nil, shared)
}

// serve is Serve with the log writer, for tests a hook that sees the health server
// once the service is built, and the shared bus connections when not nil.
func serve[C Config, S Service](ctx context.Context, args []string, getenv func(string) string,
	load Loader[C], build Builder[C, S], logTo io.Writer, hook func(*obs.Server), shared *SharedBus) error {
	cfg, err := load(args, getenv)
	if err != nil {
		return err
	}
	p := cfg.Process()
	log := obs.NewLogger(p.Name, p.Log, logTo)
	if len(p.LogWith) > 0 {
		log = log.With(p.LogWith...)
	}
	// The health server answers from the start: while the bus is awaited (a pod
	// whose auth callout is down, a bus not up yet) /healthz says ok and /readyz
	// 503 with what it waits for, as Istio's agent serves its status port unready.
	http := obs.NewServer(p.HTTP, log.Named("http"))
	// Not ready before the service is built and has registered its own checks.
	var built atomic.Bool
	http.AddReadyCheck("service", func() error {
		if !built.Load() {
			return errors.New("starting")
		}
		return nil
	})
	hctx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	httpDone := make(chan error, 1)
	go func() { httpDone <- http.Run(hctx) }()
	// stop ends the health server and returns its error.
	stop := func() error { stopHTTP(); return <-httpDone }
	var nc *nats.Conn
	if p.Bus != nil {
		var release func()
		nc, release, err = connect(ctx, *p.Bus, log.Named("bus"), http, httpDone, func(ctx context.Context, c bus.Config, log hclog.Logger) (*nats.Conn, func(), error) {
			if shared != nil {
				return shared.Connect(ctx, c, log)
			}
			nc, err := bus.Connect(ctx, c, log)
			return nc, func() { bus.Drain(nc) }, err
		})
		if err != nil {
			if herr := stop(); herr != nil {
				return herr
			}
			if ctx.Err() != nil {
				return nil // stopped while waiting for the bus
			}
			return err
		}
		defer release()
	}
	svc, err := build(cfg, Deps{Bus: nc, Clock: clock.Real{}, Log: log, Metrics: http.Registry(), Health: http, Routes: http})
	if err != nil {
		_ = stop()
		return err
	}
	built.Store(true)
	if hook != nil {
		hook(http)
	}
	log.Info("starting")
	err = Tasks(ctx, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return stop()
		case err := <-httpDone:
			httpDone <- err // for the deferred stop
			return err
		}
	}, svc.Run)
	if err == nil {
		log.Info("stopped")
	}
	return err
}

// connect waits for the bus (bus.Connect) while the health server runs: its
// readiness says what the process waits for until connected. A health server
// that fails to listen ends the wait with its error.
func connect(ctx context.Context, c bus.Config, log hclog.Logger, health *obs.Server, httpDone chan error,
	dial func(context.Context, bus.Config, hclog.Logger) (*nats.Conn, func(), error)) (*nats.Conn, func(), error) {
	var waiting atomic.Pointer[string]
	msg := "waiting for the bus at " + c.URL
	waiting.Store(&msg)
	health.AddReadyCheck("bus", func() error {
		if m := waiting.Load(); m != nil {
			return errors.New(*m)
		}
		return nil
	})
	prev := c.Waiting
	c.Waiting = func(err error) {
		m := fmt.Sprintf("waiting for the bus at %s: %v", c.URL, err)
		waiting.Store(&m)
		if prev != nil {
			prev(err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var httpErr error
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case err := <-httpDone:
			httpErr = err
			httpDone <- err // for the caller's stop
			cancel()
		case <-cctx.Done():
		}
	}()
	nc, release, err := dial(cctx, c, log)
	cancel()
	<-watched
	if httpErr != nil {
		if err == nil {
			release()
		}
		return nil, nil, httpErr
	}
	if err != nil {
		return nil, nil, err
	}
	waiting.Store(nil)
	return nc, release, nil
}

// Tasks runs every task at once until all have returned. The first to fail
// cancels the others and is what Tasks returns; a task returning nil ends only
// itself. Errors that only say the shared context was cancelled count as a clean
// stop once ctx is done, so Tasks returns nil on cancellation. A task that panics
// fails with a *PanicError instead of taking the process down with a half-stopped
// state: the other tasks are cancelled and shut down as for any other failure.
func Tasks(ctx context.Context, tasks ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(tasks))
	for _, task := range tasks {
		go func() { errc <- runTask(ctx, task) }()
	}
	var first error
	for range tasks {
		err := <-errc
		if err != nil && first == nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
			first = err
			cancel()
		}
	}
	return first
}

// PanicError is the error of a task that panicked: the value it panicked with and
// the stack where it did.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("task panicked: %v\n%s", e.Value, e.Stack) }

// runTask runs one task, turning a panic into its error.
func runTask(ctx context.Context, task func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return task(ctx)
}
