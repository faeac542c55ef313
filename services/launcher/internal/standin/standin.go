// Package standin is a stand-in for Envoy, for tests and for `make run` on a machine
// without Envoy: an executable the launcher starts exactly as it starts Envoy, that
// answers every admin call the launcher makes the way Envoy's admin API does.
//
//	argument / call                   Envoy                              stand-in
//	-c <bootstrap>                    v3 bootstrap (JSON/YAML)           v3 bootstrap as JSON: node, admin, static clusters and listeners
//	--version                         "envoy  version: <sha>/<ver>/..."  "envoy-standin version: meshagent (stand-in for Envoy's admin API)"
//	other Istio arguments             as documented                      accepted; unknown ones refused (exit 1), as Envoy does
//	sds-grpc / xds-grpc clusters      SDS and ADS over the unix sockets  the same streams: SDS default + ROOTCA, ADS clusters + listeners, ACKed
//	GET /ready                        200 LIVE once initialised, else    200 "LIVE" once SDS delivered default and ROOTCA and ADS answered
//	                                  503 PRE_INITIALIZING/INITIALIZING   (when the bootstrap has those clusters), else 503 "INITIALIZING"
//	GET /stats[?filter=re&usedonly]   "name: value" lines                listener.<addr>.downstream_cx_active per listener, listener.admin.*,
//	                                                                     server.state, server.live, sds/ads update counters
//	GET /stats/prometheus             Prometheus text                    the same gauges as envoy_* Prometheus series
//	POST /drain_listeners?graceful    drain listeners (inboundonly:      stop accepting on the listeners (inbound ones only with
//	  [&inboundonly]                  INBOUND only); connections stay     inboundonly); open connections stay until their peer closes
//	POST /quitquitquit                exit 0 now                         exit 0 now
//	SIGTERM, SIGINT                   exit 0 at once (no drain)          exit 0 at once
//	static listeners                  as configured                      a TCP echo server per listener; one with an HTTP connection
//	                                                                     manager serves GET /stats/prometheus (Istio's 15090 listener)
//
// Everything it receives and does is printed to stdout, one line each.
package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meshagent/meshagent/pkg/clock"

	// The typed configs a bootstrap from the launcher carries, so that it decodes.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// Version is what --version prints.
const Version = "envoy-standin version: meshagent (stand-in for Envoy's admin API)"

// Arguments that take a value, and flags without one, as Istio's agent passes them.
var (
	valued = map[string]bool{"-c": true, "--config-path": true, "--drain-time-s": true, "--drain-strategy": true,
		"--parent-shutdown-time-s": true, "--local-address-ip-version": true, "--file-flush-interval-msec": true,
		"--log-format": true, "-l": true, "--log-level": true, "--component-log-level": true, "--concurrency": true,
		"--service-cluster": true, "--service-node": true}
	bare = map[string]bool{"--disable-hot-restart": true, "--allow-unknown-static-fields": true}
)

// Main runs the stand-in with Envoy's arguments until it is told to stop; it
// returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	cfgPath := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--version":
			fmt.Fprintln(stdout, Version)
			return 0
		case a == "-h" || a == "--help":
			fmt.Fprintln(stdout, "usage: envoy-standin -c <bootstrap> [Envoy's other flags, ignored]: answers the launcher's admin calls as Envoy would")
			return 0
		case valued[a]:
			if i+1 >= len(args) {
				fmt.Fprintf(stderr, "envoy-standin: %s needs a value\n", a)
				return 1
			}
			if a == "-c" || a == "--config-path" {
				cfgPath = args[i+1]
			}
			i++
		case bare[a]:
		default:
			fmt.Fprintf(stderr, "envoy-standin: unknown argument %q\n", a)
			return 1
		}
	}
	if cfgPath == "" {
		fmt.Fprintln(stderr, "envoy-standin: -c <bootstrap> is required")
		return 1
	}
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "envoy-standin: %v\n", err)
		return 1
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, &b); err != nil {
		fmt.Fprintf(stderr, "envoy-standin: bootstrap %s: %v\n", cfgPath, err)
		return 1
	}
	s := &server{out: stdout, clk: clock.Real{}, node: b.GetNode().GetId(), pod: podOf(b.GetNode()), quit: make(chan struct{})}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := s.run(ctx, &b); err != nil {
		fmt.Fprintf(stderr, "envoy-standin: %v\n", err)
		return 1
	}
	return 0
}

func podOf(n *corev3.Node) string {
	if v := n.GetMetadata().GetFields()["NAME"].GetStringValue(); v != "" {
		return v
	}
	return n.GetId()
}

// server is one running stand-in.
type server struct {
	out  io.Writer
	clk  clock.Clock
	node string
	pod  string
	quit chan struct{}
	once sync.Once

	mu        sync.Mutex
	listeners []*listener
	admin     *listener
	needSDS   bool
	needADS   bool
	secrets   map[string]bool
	adsSeen   bool
	sdsCount  atomic.Int64
	adsCount  atomic.Int64
}

func (s *server) say(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, "envoy-standin: "+format+"\n", a...)
}

func (s *server) run(ctx context.Context, b *bootstrapv3.Bootstrap) error {
	sa := b.GetAdmin().GetAddress().GetSocketAddress()
	if sa == nil {
		return errors.New("bootstrap: admin.address.socket_address is required")
	}
	adminAddr := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	st := &streams{Clock: s.clk, Pod: s.pod, NodeID: s.node, Node: b.GetNode(), Report: func(l string) { s.say("%s", l) },
		GotSecrets: s.gotSecrets, GotConfig: s.gotConfig}
	for _, c := range b.GetStaticResources().GetClusters() {
		pipe := ""
		if eps := c.GetLoadAssignment().GetEndpoints(); len(eps) > 0 && len(eps[0].GetLbEndpoints()) > 0 {
			pipe = eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
		}
		switch c.GetName() {
		case "sds-grpc":
			st.SDSSocket, s.needSDS = pipe, pipe != ""
		case "xds-grpc":
			st.XDSSocket, s.needADS = pipe, pipe != ""
		}
	}
	s.secrets = map[string]bool{}
	ln, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return fmt.Errorf("admin listener %s: %w", adminAddr, err)
	}
	s.admin = newListener("admin", false, ln)
	adminSrv := &http.Server{Handler: s.adminHandler(), ReadHeaderTimeout: 5 * time.Second, ConnState: s.admin.track}
	go func() { _ = adminSrv.Serve(ln) }()
	defer adminSrv.Close()
	for _, l := range b.GetStaticResources().GetListeners() {
		if err := s.listen(l.GetName(), l.GetAddress(), l.GetTrafficDirection() == corev3.TrafficDirection_INBOUND,
			len(l.GetFilterChains()) > 0 && hasHCM(l.GetFilterChains()[0].GetFilters()), adminAddr); err != nil {
			return err
		}
	}
	defer s.closeAll()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go st.run(sctx)
	s.say("started: node %s, admin %s, pid %d", s.node, adminAddr, os.Getpid())
	select {
	case <-ctx.Done():
		s.say("signal: exiting")
	case <-s.quit:
		s.say("quitquitquit: exiting")
	}
	return nil
}

func hasHCM[F interface{ GetName() string }](fs []F) bool {
	for _, f := range fs {
		if f.GetName() == "envoy.filters.network.http_connection_manager" {
			return true
		}
	}
	return false
}

func (s *server) gotSecrets(names []string) {
	s.mu.Lock()
	for _, n := range names {
		s.secrets[n] = true
	}
	s.mu.Unlock()
	s.sdsCount.Add(1)
}

func (s *server) gotConfig(string) {
	s.mu.Lock()
	s.adsSeen = true
	s.mu.Unlock()
	s.adsCount.Add(1)
}

// state is Envoy's server state: LIVE once initialised.
func (s *server) state() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (s.needSDS && !(s.secrets["default"] && s.secrets["ROOTCA"])) || (s.needADS && !s.adsSeen) {
		return "INITIALIZING"
	}
	return "LIVE"
}

// listen opens one static listener: a TCP echo server, or (with an HTTP connection
// manager) Istio's stats listener, forwarding GET /stats/prometheus to the admin.
func (s *server) listen(name string, a *corev3.Address, inbound, http bool, adminAddr string) error {
	sa := a.GetSocketAddress()
	if sa == nil {
		return fmt.Errorf("listener %s: only socket addresses", name)
	}
	addr := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listener %s: %w", name, err)
	}
	statName := strings.TrimSuffix(sa.GetAddress(), "") + "_" + strconv.Itoa(int(sa.GetPortValue()))
	l := newListener(statName, inbound, ln)
	s.mu.Lock()
	s.listeners = append(s.listeners, l)
	s.mu.Unlock()
	if http {
		srv := &httpServer{adminAddr: adminAddr}
		go srv.serve(l)
	} else {
		go l.echo()
	}
	return nil
}

func (s *server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.listeners {
		l.close()
	}
}

func (s *server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		st := s.state()
		if st != "LIVE" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, st)
	})
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		var re *regexp.Regexp
		if f := r.URL.Query().Get("filter"); f != "" {
			var err error
			if re, err = regexp.Compile(f); err != nil {
				http.Error(w, "Invalid re2 regex", http.StatusBadRequest)
				return
			}
		}
		for _, st := range s.stats() {
			if re == nil || re.MatchString(st.name) {
				fmt.Fprintf(w, "%s: %d\n", st.name, st.value)
			}
		}
	})
	mux.HandleFunc("/stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintln(w, "# TYPE envoy_server_live gauge")
		live := 0
		if s.state() == "LIVE" {
			live = 1
		}
		fmt.Fprintf(w, "envoy_server_live{} %d\n", live)
		fmt.Fprintln(w, "# TYPE envoy_listener_downstream_cx_active gauge")
		for _, l := range s.allListeners() {
			fmt.Fprintf(w, "envoy_listener_downstream_cx_active{envoy_listener_address=%q} %d\n", l.name, l.active.Load())
		}
	})
	mux.HandleFunc("/drain_listeners", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "This endpoint requires POST", http.StatusMethodNotAllowed)
			return
		}
		q := r.URL.Query()
		_, inboundOnly := q["inboundonly"]
		_, graceful := q["graceful"]
		n := 0
		for _, l := range s.allListeners() {
			if l.name != "admin" && (!inboundOnly || l.inbound) {
				l.close()
				n++
			}
		}
		s.say("drain_listeners graceful=%t inboundonly=%t: %d listener(s) closed to new connections", graceful, inboundOnly, n)
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("/quitquitquit", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "This endpoint requires POST", http.StatusMethodNotAllowed)
			return
		}
		// The whole answer goes out before the process exits, as Envoy's does:
		// otherwise the caller may see the connection close mid-answer (a chunked body
		// ends only when the handler returns) and, taking that for a failed quit, send
		// SIGTERM to an Envoy already on its way out. A fixed length and a flush make
		// the answer complete on the wire before quit is closed.
		w.Header().Set("Content-Length", "3")
		fmt.Fprint(w, "OK\n")
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		s.once.Do(func() { close(s.quit) })
	})
	return mux
}

func (s *server) allListeners() []*listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*listener{s.admin}, s.listeners...)
}

type stat struct {
	name  string
	value int64
}

func (s *server) stats() []stat {
	live := int64(0)
	if s.state() == "LIVE" {
		live = 1
	}
	out := []stat{{"server.live", live}, {"server.state", 1 - live},
		{"cluster_manager.ads_updates", s.adsCount.Load()}, {"sds.updates", s.sdsCount.Load()}}
	for _, l := range s.allListeners() {
		out = append(out, stat{"listener." + l.name + ".downstream_cx_active", l.active.Load()},
			stat{"listener." + l.name + ".downstream_cx_total", l.total.Load()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}
