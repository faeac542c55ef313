// Package dnsproxy is the pod's DNS proxy, as Istio's agent runs it with
// ISTIO_META_DNS_CAPTURE: a DNS server on the pod's loopback (UDP and TCP) that
// answers A and AAAA queries for the mesh's hosts from the name table the control
// plane sends (pkg/nds; the relay hands it over through Handler and never
// forwards it to Envoy), and forwards every other query to the resolvers of
// resolv.conf.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/nds"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"
)

// Config is the proxy's part of the relay's configuration.
type Config struct {
	Addr       string // host:port for both UDP and TCP
	ResolvConf string // the upstream resolvers and search domains
	Namespace  string // the pod's namespace: its services answer to their short names
	Timeout    time.Duration
}

// ttl is the TTL of the proxy's own answers (as Istio's agent's).
const ttl = 30

// Server is the DNS proxy.
type Server struct {
	cfg Config
	log hclog.Logger
	m   metrics

	table atomic.Pointer[lookup]

	mu        sync.Mutex
	udp, tcp  net.Addr
	upstreams []string // host:port of resolv.conf's nameservers, set by Run
	search    []string // resolv.conf's search domains, fully qualified, set by Run
	bound     chan struct{}
	boundOnce sync.Once
}

type metrics struct {
	queries, hits, forwards *prometheus.CounterVec
	failures                *prometheus.CounterVec
	hosts                   prometheus.Gauge
}

// New returns the proxy; it neither reads resolv.conf nor listens until Run.
// Metrics go to reg (nil: none).
func New(cfg Config, reg prometheus.Registerer, log hclog.Logger) (*Server, error) {
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("dns proxy: address %q: want host:port", cfg.Addr)
	}
	if cfg.ResolvConf == "" {
		return nil, errors.New("dns proxy: resolv.conf path required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	proto := []string{"protocol"}
	s := &Server{cfg: cfg, log: log, bound: make(chan struct{}), m: metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_dns_queries_total",
			Help: "DNS queries received by the pod's DNS proxy, by protocol (udp, tcp)."}, proto),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_dns_hits_total",
			Help: "DNS queries answered from the control plane's name table, by protocol."}, proto),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_dns_forwards_total",
			Help: "DNS queries forwarded to a resolver of resolv.conf and answered by it, by protocol."}, proto),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_dns_failures_total",
			Help: "DNS queries the proxy answered with SERVFAIL or FORMERR, by protocol and reason (upstream, malformed)."}, []string{"protocol", "reason"}),
		hosts: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshagent_xds_relay_dns_table_hosts",
			Help: "Hosts in the name table the DNS proxy answers from."}),
	}}
	s.table.Store(&lookup{names: map[string]*entry{}})
	if reg != nil {
		for _, c := range []prometheus.Collector{s.m.queries, s.m.hits, s.m.forwards, s.m.failures, s.m.hosts} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("dns proxy metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Bound is closed once both sockets are bound.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// Addrs are the bound UDP and TCP addresses (nil before Run binds them).
func (s *Server) Addrs() (udp, tcp net.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.udp, s.tcp
}

// Ready reports whether the proxy is serving.
func (s *Server) Ready() error {
	select {
	case <-s.bound:
		return nil
	default:
		return errors.New("dns proxy not listening yet")
	}
}

// Run reads resolv.conf, serves UDP and TCP until ctx ends, then stops within a
// few seconds; it returns nil then.
func (s *Server) Run(ctx context.Context) error {
	rc, err := dns.ClientConfigFromFile(s.cfg.ResolvConf)
	if err != nil {
		return fmt.Errorf("dns proxy: %w", err)
	}
	var ups, search []string
	for _, ns := range rc.Servers {
		// A nameserver may carry its port (ip:port; resolv(5) has none, tests and
		// resolvers on another port need one).
		if _, err := netip.ParseAddrPort(ns); err == nil {
			ups = append(ups, ns)
			continue
		}
		ups = append(ups, net.JoinHostPort(ns, rc.Port))
	}
	for _, d := range rc.Search {
		if d = strings.Trim(strings.ToLower(d), "."); d != "" {
			search = append(search, d+".")
		}
	}
	pc, err := net.ListenPacket("udp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("dns proxy: %w", err)
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("dns proxy: %w", err)
	}
	s.mu.Lock()
	s.upstreams, s.search = ups, search
	s.udp, s.tcp = pc.LocalAddr(), ln.Addr()
	s.mu.Unlock()
	udp := &dns.Server{PacketConn: pc, Handler: s.handler("udp")}
	tcp := &dns.Server{Listener: ln, Handler: s.handler("tcp")}
	errc := make(chan error, 2)
	go func() { errc <- udp.ActivateAndServe() }()
	go func() { errc <- tcp.ActivateAndServe() }()
	s.boundOnce.Do(func() { close(s.bound) })
	s.log.Info("dns proxy listening", "udp", pc.LocalAddr(), "tcp", ln.Addr(), "upstreams", ups, "search", search)
	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = udp.ShutdownContext(sctx)
	_ = tcp.ShutdownContext(sctx)
	if serveErr != nil {
		return fmt.Errorf("dns proxy: %w", serveErr)
	}
	return nil
}

// SetTable replaces the names the proxy answers for.
func (s *Server) SetTable(t nds.Table) {
	l := build(t, s.cfg.Namespace)
	s.table.Store(l)
	s.m.hosts.Set(float64(len(t)))
	s.log.Info("name table updated", "hosts", len(t), "names", len(l.names))
}

// Handler is the relay.Handler for the name table: it feeds the proxy and never
// reaches Envoy.
type Handler struct{ s *Server }

// Handler returns the relay handler that feeds s.
func (s *Server) Handler() Handler { return Handler{s} }

// TypeURL implements relay.Handler.
func (Handler) TypeURL() string { return nds.TypeURL }

// Handle decodes the whole response before applying it: a bad resource rejects
// the response (the relay NACKs it) and keeps the table the proxy has. Several
// resources are merged.
func (h Handler) Handle(_ context.Context, resources []*anypb.Any) error {
	t := nds.Table{}
	for i, a := range resources {
		if a.GetTypeUrl() != nds.TypeURL {
			return fmt.Errorf("resource %d: type %q, want %s", i, a.GetTypeUrl(), nds.TypeURL)
		}
		part, err := nds.Unmarshal(a.GetValue())
		if err != nil {
			return fmt.Errorf("resource %d: %w", i, err)
		}
		for host, ni := range part {
			if !validHost(host) {
				return fmt.Errorf("resource %d: host %q is not a domain name", i, host)
			}
			for _, ip := range ni.IPs {
				if _, err := netip.ParseAddr(ip); err != nil {
					return fmt.Errorf("resource %d: host %q: address %q: %v", i, host, ip, err)
				}
			}
			t[host] = ni
		}
	}
	h.s.SetTable(t)
	return nil
}

// lookup is the table as the proxy answers from it: every name a host answers
// to, fully qualified and lower case, to the host's addresses.
type lookup struct {
	names map[string]*entry
}

type entry struct {
	v4, v6 []netip.Addr
}

// build indexes t: each host answers to its name and its alternative hosts; a
// Kubernetes service also to name.namespace and name.namespace.svc and, in the
// pod's own namespace, to its short name, as Istio's agent does.
func build(t nds.Table, namespace string) *lookup {
	l := &lookup{names: map[string]*entry{}}
	for host, ni := range t {
		e := &entry{}
		for _, ip := range ni.IPs {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				continue
			}
			if a = a.Unmap(); a.Is4() {
				e.v4 = append(e.v4, a)
			} else {
				e.v6 = append(e.v6, a)
			}
		}
		names := append([]string{host}, ni.AltHosts...)
		if ni.Registry == "Kubernetes" && ni.Shortname != "" && ni.Namespace != "" {
			names = append(names, ni.Shortname+"."+ni.Namespace, ni.Shortname+"."+ni.Namespace+".svc")
			if ni.Namespace == namespace {
				names = append(names, ni.Shortname)
			}
		}
		for _, n := range names {
			l.names[dns.Fqdn(strings.ToLower(n))] = e
		}
	}
	return l
}

// find returns the entry for name and, when name is a table name with one of the
// search domains appended (a resolver's expansion of a name that already was
// complete), the table name to answer with as a CNAME.
func (l *lookup) find(name string, search []string) (e *entry, target string) {
	if e := l.names[name]; e != nil {
		return e, ""
	}
	for _, d := range search {
		if p, ok := strings.CutSuffix(name, "."+d); ok {
			if e := l.names[p+"."]; e != nil {
				return e, p + "."
			}
		}
	}
	return nil, ""
}

func (s *Server) handler(proto string) dns.HandlerFunc {
	return func(w dns.ResponseWriter, req *dns.Msg) {
		s.m.queries.WithLabelValues(proto).Inc()
		resp := s.answer(proto, req)
		if proto == "udp" {
			// A UDP answer fits the client's buffer (EDNS0, else 512 bytes) or is
			// truncated with TC set, and the client asks again over TCP.
			size := dns.MinMsgSize
			if o := req.IsEdns0(); o != nil && int(o.UDPSize()) > size {
				size = int(o.UDPSize())
			}
			resp.Truncate(size)
		}
		if err := w.WriteMsg(resp); err != nil {
			s.log.Debug("dns write", "protocol", proto, "error", err)
		}
	}
}

func (s *Server) answer(proto string, req *dns.Msg) *dns.Msg {
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		s.m.failures.WithLabelValues(proto, "malformed").Inc()
		return new(dns.Msg).SetRcode(req, dns.RcodeFormatError)
	}
	q := req.Question[0]
	if q.Qclass == dns.ClassINET && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) {
		s.mu.Lock()
		search := s.search
		s.mu.Unlock()
		if e, target := s.table.Load().find(strings.ToLower(q.Name), search); e != nil {
			s.m.hits.WithLabelValues(proto).Inc()
			return reply(req, q, e, target)
		}
	}
	resp, err := s.forward(proto, req)
	if err != nil {
		s.m.failures.WithLabelValues(proto, "upstream").Inc()
		s.log.Debug("dns forward failed", "name", q.Name, "error", err)
		return new(dns.Msg).SetRcode(req, dns.RcodeServerFailure)
	}
	s.m.forwards.WithLabelValues(proto).Inc()
	return resp
}

// reply answers q from e: records of the asked family only, and NOERROR with no
// answer when the host has none of that family (so the client looks no further).
func reply(req *dns.Msg, q dns.Question, e *entry, target string) *dns.Msg {
	resp := new(dns.Msg).SetReply(req)
	resp.Authoritative = true
	resp.RecursionAvailable = true
	owner := q.Name
	if target != "" {
		resp.Answer = append(resp.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: target})
		owner = target
	}
	hdr := dns.RR_Header{Name: owner, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: ttl}
	if q.Qtype == dns.TypeA {
		for _, a := range e.v4 {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		}
	} else {
		for _, a := range e.v6 {
			resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	return resp
}

// forward asks resolv.conf's resolvers in turn over the protocol the query came
// on, so a truncated upstream answer over UDP stays truncated and the client's
// retry over TCP is answered in full over TCP.
func (s *Server) forward(proto string, req *dns.Msg) (*dns.Msg, error) {
	s.mu.Lock()
	ups := s.upstreams
	s.mu.Unlock()
	if len(ups) == 0 {
		return nil, errors.New("no resolvers in " + s.cfg.ResolvConf)
	}
	c := &dns.Client{Net: proto, Timeout: s.cfg.Timeout}
	var errs []error
	for _, up := range ups {
		resp, _, err := c.Exchange(req, up)
		if err == nil {
			resp.Id = req.Id
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
	}
	return nil, errors.Join(errs...)
}

// validHost reports whether h is a host name the proxy can answer for: dot
// separated labels of 1 to 63 letters, digits, '-' or '_', 253 bytes at most.
func validHost(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for l := range strings.SplitSeq(h, ".") {
		if l == "" || len(l) > 63 {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}
