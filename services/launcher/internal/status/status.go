// Package status is the launcher's status server, Istio's status port (15020):
// /healthz/ready (Envoy ready, certificates present, relay connected),
// /stats/prometheus (Envoy's stats merged with the pod services' metrics, each
// source bounded), /quitquitquit (stop now), /drain (drain Envoy's listeners and
// report not ready), and the app's own health probes, rewritten to
// /app-health/<container>/<probe> as Istio's injector does (ISTIO_KUBE_APP_PROBERS).
package status

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is what the status server serves.
type Config struct {
	Addr string
	// Ready reports nil when the pod's proxy may take traffic.
	Ready func(ctx context.Context) error
	// Quit stops the launcher now (Envoy asked to exit, no drain wait).
	Quit func()
	// Drain drains Envoy's listeners without stopping it.
	Drain func(ctx context.Context) error
	// EnvoyStats is Envoy's Prometheus stats URL (admin /stats/prometheus); ""
	// while no Envoy runs.
	EnvoyStats func() string
	// Sources are more Prometheus text URLs merged in (the pod services' /metrics).
	Sources []string
	// AppMetrics is the application's metrics URL (Istio's prometheus
	// annotation merge), scraped last with AppTimeout; "" for none.
	AppMetrics string
	AppTimeout time.Duration
	// Gatherer adds the launcher's own metrics.
	Gatherer prometheus.Gatherer
	// MaxScrape bounds the bytes read from one source.
	MaxScrape int
	Probers   Probers
	Log       hclog.Logger
}

// Server is the status server.
type Server struct {
	cfg    Config
	client *http.Client

	mu    sync.Mutex
	ln    net.Addr
	bound chan struct{}
}

// New returns the server; it does not listen until Run.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	return &Server{cfg: cfg, client: &http.Client{Timeout: 5 * time.Second}, bound: make(chan struct{})}
}

// Addr is the bound address once Run has bound, else nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln
}

// Bound is closed once the listener is bound.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// Handler serves every endpoint.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", s.ready)
	mux.HandleFunc("/stats/prometheus", s.stats)
	mux.HandleFunc("/quitquitquit", s.post(func(r *http.Request) error { s.cfg.Quit(); return nil }))
	mux.HandleFunc("/drain", s.post(func(r *http.Request) error { return s.cfg.Drain(r.Context()) }))
	for path, p := range s.cfg.Probers {
		mux.Handle(path, p.handler(s.cfg.Log))
	}
	return mux
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := s.cfg.Ready(ctx); err != nil {
		http.Error(w, strings.ReplaceAll(err.Error(), "\n", "; "), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte("ready\n"))
}

// post allows only POST (or PUT, as Istio does) from loopback and not from a web
// page (refuseBrowser): these endpoints stop or drain the pod's proxy. Every refusal
// is logged, as it may be an attack from a page open on the host.
func (s *Server) post(f func(*http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost && r.Method != http.MethodPut {
			w.Header().Set("Allow", "POST, PUT")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if !fromLoopback(r) {
			http.Error(w, "only from the pod itself", http.StatusForbidden)
			return
		}
		if err := refuseBrowser(r); err != nil {
			s.cfg.Log.Warn("status request refused", "path", r.URL.Path, "origin", r.Header.Get("Origin"),
				"sec_fetch_site", r.Header.Get("Sec-Fetch-Site"), "content_type", r.Header.Get("Content-Type"), "error", err)
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		if err := f(r); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("OK\n"))
	}
}

func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Run listens and serves until ctx ends; it returns nil on cancellation.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen status %s: %w", s.cfg.Addr, err)
	}
	s.mu.Lock()
	s.ln = ln.Addr()
	s.mu.Unlock()
	close(s.bound)
	s.cfg.Log.Info("status server listening", "addr", ln.Addr().String())
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve status: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}
