package obs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/buildinfo"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports nil when a dependency is ready.
type Check func() error

// Server serves /healthz, /readyz and /metrics, and whatever else a service mounts
// with Handle on the same listener. /readyz is 200 only when every registered
// readiness check passes; the body names the ones that fail.
type Server struct {
	addr     string
	log      hclog.Logger
	registry *prometheus.Registry
	mux      *http.ServeMux
	// wrapped is mux inside every Use wrapper so far: Use may come after Run (a
	// service built once the bus is up, while the server already answers health).
	wrapped atomic.Pointer[http.Handler]
	wrapMu  sync.Mutex
	wrap    []func(http.Handler) http.Handler

	mu     sync.Mutex
	checks map[string]Check
	bound  chan struct{}
	ln     net.Addr
}

// NewServer returns a server for addr (host:port; port 0 picks one). It does not
// listen until Run. Metrics are registered on Registry().
func NewServer(addr string, log hclog.Logger) *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{addr: addr, log: log, registry: reg, checks: map[string]Check{}, bound: make(chan struct{})}
	s.mux = s.handler()
	var h http.Handler = s.mux
	s.wrapped.Store(&h)
	return s
}

// Handle serves h for pattern (http.ServeMux syntax) on the same listener as
// /healthz, /readyz and /metrics, which stay the server's own: a service with a
// page or an API of its own (the operator's dashboard) mounts it at "/". It panics,
// as ServeMux does, when pattern conflicts with a route already there.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Use wraps every request the server answers in mw, its own endpoints included;
// the last wrapper added sees a request first. Requests from then on go through it,
// also when the server already runs.
func (s *Server) Use(mw func(http.Handler) http.Handler) {
	s.wrapMu.Lock()
	defer s.wrapMu.Unlock()
	s.wrap = append(s.wrap, mw)
	var h http.Handler = s.mux
	for _, w := range s.wrap {
		h = w(h)
	}
	s.wrapped.Store(&h)
}

// Registry is where the service registers its metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// AddReadyCheck adds a named readiness check.
func (s *Server) AddReadyCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Addr returns the bound address once Run has bound its listener, else nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln
}

// Bound is closed when the listener is bound.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// Ready runs every check and returns the failures joined.
func (s *Server) Ready() error {
	s.mu.Lock()
	names := make([]string, 0, len(s.checks))
	for n := range s.checks {
		names = append(names, n)
	}
	checks := make([]Check, len(names))
	sort.Strings(names)
	for i, n := range names {
		checks[i] = s.checks[n]
	}
	s.mu.Unlock()
	var errs []error
	for i, c := range checks {
		if err := c(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", names[i], err))
		}
	}
	return errors.Join(errs...)
}

func (s *Server) handler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set(buildinfo.Header, buildinfo.Get()) // meshctl status shows it
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if err := s.Ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(strings.ReplaceAll(err.Error(), "\n", "; ") + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}))
	return mux
}

// Run listens and serves until ctx is done, then shuts down within five seconds.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen http %s: %w", s.addr, err)
	}
	s.mu.Lock()
	s.ln = ln.Addr()
	s.mu.Unlock()
	close(s.bound)
	s.log.Info("http listening", "addr", ln.Addr().String())
	return Serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*s.wrapped.Load()).ServeHTTP(w, r)
	}))
}

// Serve answers HTTP on ln with h until ctx is done, then shuts down within five
// seconds. Requests live in ctx, so long ones (an event stream) end with it instead
// of holding the shutdown up.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown http: %w", err)
	}
	<-errc
	return nil
}
