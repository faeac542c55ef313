// Package dashboard is the operator service's work: the operator's view of a fleet.
// It keeps the certificate inventory current (inventory.Keeper), serves it as a web
// page (HTML, CSS and JS embedded in the binary, nothing fetched from elsewhere)
// with a live event feed over server-sent events, registers fleet metrics computed
// from the events (served at the process's /metrics), and optionally writes every
// event it sees to a JSON-lines file (auditlog.Sink).
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/inventory/fleetindex"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

//go:embed web
var web embed.FS

// Config is what a Server needs besides its bus connection.
type Config struct {
	Metrics  prometheus.Registerer // where the fleet metrics go (the process's /metrics)
	Replicas int                   // of the inventory bucket
	Sink     *auditlog.Sink        // optional JSON-lines copy of every event seen live
	// History is how far back the feed starts for a new page (replayed from the
	// stream, the newest recentMax events of each stream at most); 0 means 30 minutes.
	History time.Duration
	// Listen is the address the process serves the dashboard on (-http-addr).
	Listen string
	// Hosts are host names the dashboard answers besides its own address
	// (hostGuard): the names an operator reaches it by through a proxy or DNS.
	Hosts []string
}

// Server is one replica of the operator's inventory keeper and dashboard.
type Server struct {
	cfg     Config
	nc      *nats.Conn
	clk     clock.Clock
	log     hclog.Logger
	keeper  *inventory.Keeper
	metrics *fleetMetrics

	mu      sync.Mutex
	view    *fleetindex.Index // the bucket, as the watch last saw it
	synced  bool              // the watch delivered every record the bucket held when it started
	watched bool              // the watch started: pages are served, from what it delivered so far
	loaded  int               // records the watch delivered before synced
	behind  uint64            // records still to come at the last delivery before synced
	recent  []feedItem        // the last events, oldest first
	clients map[chan feedItem]struct{}
}

// feedItem is one message of the live feed.
type feedItem struct {
	Kind string // "ev" or "inventory"
	Data []byte
}

const recentMax = 300

// New builds a server and registers its metrics on cfg.Metrics; nothing runs until
// Run. Certificates' time to expiry and the feed's history are reckoned on clk.
func New(cfg Config, nc *nats.Conn, clk clock.Clock, log hclog.Logger) (*Server, error) {
	if nc == nil {
		return nil, errors.New("dashboard: no bus connection")
	}
	if cfg.Metrics == nil {
		return nil, errors.New("dashboard: no metrics registry")
	}
	if cfg.History <= 0 {
		cfg.History = 30 * time.Minute
	}
	s := &Server{cfg: cfg, nc: nc, clk: clk, log: log, view: fleetindex.New(), clients: map[chan feedItem]struct{}{}}
	m, err := newFleetMetrics(cfg.Metrics, s.gauges, clk)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// Ready is nil once the watch of the inventory has started (the process's
// /readyz): a replica serves while it catches up with the bucket, and its pages
// say how far it is (loading) until it has.
func (s *Server) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.watched {
		return errors.New("inventory watch not started yet")
	}
	return nil
}

// Run keeps the inventory and follows the events until ctx ends; it returns nil on
// cancellation. Its tasks run under lifecycle.Tasks: the first to fail stops the
// others. The page is served by whoever serves Handler (the operator mounts it on
// the process's HTTP listener).
func (s *Server) Run(ctx context.Context) error {
	if s.cfg.Sink != nil {
		defer func() { _ = s.cfg.Sink.Close() }()
	}
	// The signers create the event stream: a replica started before them waits for
	// it, not ready until then, rather than failing.
	err := bus.Retry(ctx, clock.Real{}, s.log, "event stream "+events.StreamEvents, func(ctx context.Context) error {
		_, err := auditlog.Open(ctx, s.nc)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return bus.Pending(err)
		}
		return err
	})
	if err != nil {
		return err
	}
	if s.keeper, err = inventory.NewKeeper(ctx, s.nc, s.cfg.Replicas, clock.Real{}, s.log.Named("inventory")); err != nil {
		return err
	}
	if err := s.follow(ctx); err != nil {
		return err
	}
	return lifecycle.Tasks(ctx, s.keeper.Run, s.watch)
}

// follow replays the recent history into the feed — the events of the last
// cfg.History, and no more than the newest recentMax of each stream, which is all
// a page is shown — then follows the live events. Nothing is counted from the
// replay: the fleet's counts are the inventory's (inventory.Window).
func (s *Server) follow(ctx context.Context) error {
	l, err := auditlog.Open(ctx, s.nc)
	if err != nil {
		return err
	}
	start := make(chan struct{})
	go func() {
		err := l.Read(ctx, auditlog.Filter{Since: s.clk.Now().Add(-s.cfg.History), Last: recentMax}, true, func(auditlog.Start) { close(start) },
			func(e auditlog.Entry) error {
				s.event(e)
				return nil
			})
		if err != nil && ctx.Err() == nil {
			s.log.Error("event feed stopped", "error", err)
		}
	}()
	select {
	case <-start:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// event takes one event into the feed, the metrics and the sink.
func (s *Server) event(e auditlog.Entry) {
	if e.Seq == 0 { // live: counted and written once, replays are not
		s.metrics.observe(e)
		if s.cfg.Sink != nil {
			if err := s.cfg.Sink.Write(e); err != nil {
				s.log.Error("audit file", "error", err)
			}
		}
	}
	if e.Err == nil && e.Bench() {
		return // meshctl bench's load: counted and written, not in the page's feed
	}
	item := feedEvent{ID: e.Meta.ID, Seq: e.Seq, Time: e.Meta.Time, Type: auditlog.ShortType(e.Meta.Type), Pod: e.Pod(), Data: e.Payload}
	if item.Time.IsZero() {
		item.Time = s.clk.Now()
	}
	if e.Err != nil {
		item.Error = e.Err.Error()
	} else {
		// As it was: a replayed event's durations are from its own time.
		item.Text = auditlog.Describe(e.Payload, item.Time)
	}
	b, err := json.Marshal(item)
	if err != nil {
		return
	}
	s.broadcast(feedItem{Kind: "ev", Data: b}, true)
}

type feedEvent struct {
	ID    string         `json:"id"`
	Seq   uint64         `json:"seq,omitempty"`
	Time  time.Time      `json:"time"`
	Type  string         `json:"type"`
	Pod   string         `json:"pod,omitempty"`
	Text  string         `json:"text,omitempty"`
	Error string         `json:"error,omitempty"`
	Data  events.Payload `json:"data,omitempty"`
}

func (s *Server) broadcast(it feedItem, keep bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if keep {
		s.recent = append(s.recent, it)
		if len(s.recent) > recentMax {
			s.recent = s.recent[len(s.recent)-recentMax:]
		}
	}
	for c := range s.clients {
		select {
		case c <- it:
		default: // a slow page misses an event rather than stalling the feed
		}
	}
}

// inventoryTick is how often, at most, the pages are told that the inventory
// changed: a burst of thousands of certificates is one reload a tick, not one per
// certificate.
const inventoryTick = 250 * time.Millisecond

// watch mirrors the bucket into the index, one record at a time, and tells the
// pages when it changed.
func (s *Server) watch(ctx context.Context) error {
	start := s.clk.Now()
	w, err := bus.OpenWatch(ctx, s.clk, s.log, "inventory watch", func(ctx context.Context) (jetstream.KeyWatcher, error) {
		return s.keeper.Bucket().WatchAll(ctx)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch inventory: %w", err)
	}
	defer func() { _ = w.Stop() }()
	s.mu.Lock()
	s.watched = true
	s.mu.Unlock()
	timer := s.clk.NewTimer(inventoryTick)
	timer.Stop()
	defer timer.Stop()
	var tick <-chan time.Time // armed while a change is not yet announced
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			tick = nil
			s.mu.Lock()
			s.view.Flush() // merged here, so that a page rarely pays for it
			s.mu.Unlock()
			s.broadcast(feedItem{Kind: "inventory", Data: []byte("{}")}, false)
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil // the watch closed as ctx ended: a shutdown, not a failure
				}
				return errors.New("inventory watch closed")
			}
			s.apply(e, start)
			if tick == nil {
				timer.Reset(inventoryTick)
				tick = timer.C()
			}
		}
	}
}

// apply takes one update of the watch (nil: every record it started with is in).
func (s *Server) apply(e jetstream.KeyValueEntry, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case e == nil:
		s.synced, s.behind = true, 0
		s.view.Flush()
		n, skipped := s.view.Len()
		s.log.Info("inventory loaded", "certificates", n, "skipped", skipped, "records", s.loaded, "took", s.clk.Now().Sub(start).Round(time.Millisecond))
		return
	case e.Operation() == jetstream.KeyValuePut:
		if s.view.Put(e.Key(), e.Value()) && s.synced {
			_, n := s.view.Len()
			s.log.Warn("inventory record skipped", "count", n, "key", e.Key())
		}
	default:
		s.view.Delete(e.Key())
	}
	if !s.synced {
		s.loaded, s.behind = s.loaded+1, e.Delta()
	}
}

// gauges is the index's figures for the fleet gauges (false before the watch).
func (s *Server) gauges(f func(*fleetindex.Index)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.watched && !s.synced {
		return false
	}
	f(s.view)
	return true
}

// Handler serves the page and its API (the process serves /metrics and health).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(web, "web")
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/inventory", s.serveInventory)
	mux.HandleFunc("GET /api/events", s.serveEvents)
	return mux
}

// Guard lets through only requests that name this dashboard (hostGuard): the
// operator wraps its whole listener in it, /metrics and health included.
func (s *Server) Guard(next http.Handler) http.Handler {
	return newHostGuard(s.cfg.Listen, nil, s.cfg.Hosts, next)
}

// serveInventory is one page of the inventory as JSON: filtered, sorted and cut
// by the index (query.go), with the whole inventory's counts. meshctl bench's
// certificates are left out (and counted) unless ?bench=1. While the replica
// catches up with the bucket, the page says how far it is ("loading").
func (s *Server) serveInventory(w http.ResponseWriter, r *http.Request) {
	q, err := fleetindex.ParseQuery(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	now := s.clk.Now()
	s.mu.Lock()
	if !s.watched && !s.synced {
		s.mu.Unlock()
		http.Error(w, "inventory not loaded yet", http.StatusServiceUnavailable)
		return
	}
	p := s.view.Page(q, now)
	if !s.synced {
		p.Loading = &inventory.Loading{Loaded: s.loaded, Remaining: s.behind}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(p)
}

// pingEvery is how often an idle feed is pinged, so that proxies keep it open.
const pingEvery = 15 * time.Second

// serveEvents is the live feed (server-sent events): the recent events first, then
// every new one ("ev"), and "inventory" whenever the inventory changed.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	c := make(chan feedItem, 256)
	s.mu.Lock()
	backlog := append([]feedItem(nil), s.recent...)
	s.clients[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.clients, c)
		s.mu.Unlock()
	}()
	send := func(it feedItem) bool {
		_, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", it.Kind, it.Data)
		return err == nil
	}
	for _, it := range backlog {
		if !send(it) {
			return
		}
	}
	fl.Flush()
	ping := s.clk.NewTimer(pingEvery)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case it := <-c:
			if !send(it) {
				return
			}
			fl.Flush()
		case <-ping.C():
			ping.Reset(pingEvery)
			if _, err := fmt.Fprint(w, ": ping\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}
