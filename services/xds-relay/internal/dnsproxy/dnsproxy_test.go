package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/nds"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"
)

// stub is a real DNS server on loopback standing in for the resolver of
// resolv.conf: it answers every A query for big.example. with 40 records (more
// than 512 bytes) and every other name with one record, and counts queries.
type stub struct {
	addr    string
	queries atomic.Int64
}

func startStub(t *testing.T) *stub {
	t.Helper()
	st := &stub{}
	pc, ln := listenUDPAndTCP(t)
	st.addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		st.queries.Add(1)
		m := new(dns.Msg).SetReply(r)
		q := r.Question[0]
		n := 1
		if q.Name == "big.example." {
			n = 40
		}
		for i := range n {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.IPv4(192, 0, 2, byte(i+1))})
		}
		if _, isUDP := w.RemoteAddr().(*net.UDPAddr); isUDP {
			m.Truncate(dns.MinMsgSize)
		}
		_ = w.WriteMsg(m)
	})
	udp := &dns.Server{PacketConn: pc, Handler: h}
	tcp := &dns.Server{Listener: ln, Handler: h}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	t.Cleanup(func() { _ = udp.Shutdown(); _ = tcp.Shutdown() })
	return st
}

// listenUDPAndTCP binds one loopback port for both UDP and TCP, as a resolver
// serves. The kernel picks a free UDP port, whose TCP twin another process may
// hold: then it tries another port.
func listenUDPAndTCP(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	var lastErr error
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
		lastErr = err
	}
	t.Fatalf("no loopback port free for both udp and tcp in 20 tries: %v", lastErr)
	return nil, nil
}

type env struct {
	s    *Server
	reg  *prometheus.Registry
	stub *stub
	udp  string
	tcp  string
}

var table = nds.Table{
	"reviews.default.svc.cluster.local": {IPs: []string{"10.96.0.20", "fd00::20"}, Registry: "Kubernetes", Shortname: "reviews", Namespace: "default"},
	"ratings.other.svc.cluster.local":   {IPs: []string{"10.96.0.30"}, Registry: "Kubernetes", Shortname: "ratings", Namespace: "other"},
	"api.example.com":                   {IPs: []string{"240.240.0.1"}, AltHosts: []string{"api.example.org"}},
}

func start(t *testing.T) *env {
	t.Helper()
	st := startStub(t)
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	conf := fmt.Sprintf("nameserver %s\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n", st.addr)
	if err := os.WriteFile(rc, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(Config{Addr: "127.0.0.1:0", ResolvConf: rc, Namespace: "default"}, reg,
		hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Handler().Handle(context.Background(), []*anypb.Any{nds.Any(table)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	select {
	case <-s.Bound():
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	u, c := s.Addrs()
	return &env{s: s, reg: reg, stub: st, udp: u.String(), tcp: c.String()}
}

func query(t *testing.T, network, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	m := new(dns.Msg).SetQuestion(name, qtype)
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s %s: %v", network, name, dns.TypeToString[qtype], err)
	}
	return r
}

func addrs(r *dns.Msg) (out []string) {
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.Hdr.Name+" A "+v.A.String())
		case *dns.AAAA:
			out = append(out, v.Hdr.Name+" AAAA "+v.AAAA.String())
		case *dns.CNAME:
			out = append(out, v.Hdr.Name+" CNAME "+v.Target)
		}
	}
	return out
}

func TestAnswersFromTheNameTable(t *testing.T) {
	e := start(t)
	for _, c := range []struct {
		name  string
		qtype uint16
		want  []string
	}{
		{"reviews.default.svc.cluster.local.", dns.TypeA, []string{"reviews.default.svc.cluster.local. A 10.96.0.20"}},
		{"REVIEWS.default.svc.cluster.local.", dns.TypeAAAA, []string{"REVIEWS.default.svc.cluster.local. AAAA fd00::20"}},
		// A short name within the pod's namespace, and name.namespace anywhere.
		{"reviews.", dns.TypeA, []string{"reviews. A 10.96.0.20"}},
		{"ratings.other.", dns.TypeA, []string{"ratings.other. A 10.96.0.30"}},
		{"api.example.org.", dns.TypeA, []string{"api.example.org. A 240.240.0.1"}},
		// A complete name with a search domain appended: a CNAME to the name.
		{"api.example.com.default.svc.cluster.local.", dns.TypeA, []string{
			"api.example.com.default.svc.cluster.local. CNAME api.example.com.", "api.example.com. A 240.240.0.1"}},
		// A host without addresses of the family: NOERROR, no answer.
		{"ratings.other.svc.cluster.local.", dns.TypeAAAA, nil},
	} {
		r := query(t, "udp", e.udp, c.name, c.qtype)
		if r.Rcode != dns.RcodeSuccess || !r.Authoritative || fmt.Sprint(addrs(r)) != fmt.Sprint(c.want) {
			t.Errorf("%s %s: rcode %s aa %v answer %v, want %v", c.name, dns.TypeToString[c.qtype], dns.RcodeToString[r.Rcode], r.Authoritative, addrs(r), c.want)
		}
	}
	// ratings is in another namespace: its short name is not the table's, so it is forwarded.
	if r := query(t, "udp", e.udp, "ratings.", dns.TypeA); r.Authoritative || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.1" {
		t.Errorf("ratings. (other namespace) answered %v, want the upstream's", addrs(r))
	}
	if got := e.stub.queries.Load(); got != 1 {
		t.Errorf("upstream saw %d queries, want 1 (only the other namespace's short name)", got)
	}
	if v := obstest.Metric(t, e.reg, "meshagent_xds_relay_dns_hits_total", map[string]string{"protocol": "udp"}); v != 7 {
		t.Errorf("hits = %v, want 7", v)
	}
	if v := obstest.Metric(t, e.reg, "meshagent_xds_relay_dns_queries_total", map[string]string{"protocol": "udp"}); v != 8 {
		t.Errorf("queries = %v, want 8", v)
	}
}

func TestMissForwardedToResolvConf(t *testing.T) {
	e := start(t)
	for _, network := range []string{"udp", "tcp"} {
		addr := e.udp
		if network == "tcp" {
			addr = e.tcp
		}
		r := query(t, network, addr, "www.example.net.", dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || fmt.Sprint(addrs(r)) != "[www.example.net. A 192.0.2.1]" {
			t.Errorf("%s: forwarded answer %v rcode %s", network, addrs(r), dns.RcodeToString[r.Rcode])
		}
		// Other types for table names are forwarded too.
		if r := query(t, network, addr, "reviews.default.svc.cluster.local.", dns.TypeTXT); r.Authoritative {
			t.Errorf("%s: TXT for a table name answered by the proxy", network)
		}
		if v := obstest.Metric(t, e.reg, "meshagent_xds_relay_dns_forwards_total", map[string]string{"protocol": network}); v != 2 {
			t.Errorf("%s forwards = %v, want 2", network, v)
		}
	}
	if got := e.stub.queries.Load(); got != 4 {
		t.Errorf("upstream saw %d queries, want 4", got)
	}
}

func TestTruncatedOverUDPWholeOverTCP(t *testing.T) {
	e := start(t)
	// Forwarded: the upstream's answer does not fit 512 bytes.
	u := query(t, "udp", e.udp, "big.example.", dns.TypeA)
	if !u.Truncated || len(u.Answer) >= 40 {
		t.Fatalf("udp: truncated %v with %d answers, want TC set and fewer than 40", u.Truncated, len(u.Answer))
	}
	tc := query(t, "tcp", e.tcp, "big.example.", dns.TypeA)
	if tc.Truncated || len(tc.Answer) != 40 {
		t.Fatalf("tcp: truncated %v with %d answers, want the whole 40", tc.Truncated, len(tc.Answer))
	}
	// From the table: a host with more addresses than 512 bytes hold.
	big := nds.Table{"many.default.svc.cluster.local": {}}
	ni := big["many.default.svc.cluster.local"]
	for i := range 60 {
		ni.IPs = append(ni.IPs, fmt.Sprintf("10.1.0.%d", i+1))
	}
	big["many.default.svc.cluster.local"] = ni
	e.s.SetTable(big)
	u = query(t, "udp", e.udp, "many.default.svc.cluster.local.", dns.TypeA)
	if !u.Truncated || len(u.Answer) >= 60 {
		t.Fatalf("table over udp: truncated %v with %d answers", u.Truncated, len(u.Answer))
	}
	tc = query(t, "tcp", e.tcp, "many.default.svc.cluster.local.", dns.TypeA)
	if tc.Truncated || len(tc.Answer) != 60 {
		t.Fatalf("table over tcp: truncated %v with %d answers, want 60", tc.Truncated, len(tc.Answer))
	}
	// The client's EDNS0 buffer is honoured over UDP.
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second, UDPSize: 4096}
	m := new(dns.Msg).SetQuestion("many.default.svc.cluster.local.", dns.TypeA)
	m.SetEdns0(4096, false)
	r, _, err := c.Exchange(m, e.udp)
	if err != nil || r.Truncated || len(r.Answer) != 60 {
		t.Fatalf("edns0 4096 over udp: err %v truncated %v answers %d", err, r.Truncated, len(r.Answer))
	}
}

func TestUpstreamDownIsServfail(t *testing.T) {
	e := start(t)
	// Point the proxy at a port nobody serves.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	pc.Close()
	e.s.mu.Lock()
	e.s.upstreams = []string{dead}
	e.s.cfg.Timeout = 200 * time.Millisecond
	e.s.mu.Unlock()
	r := query(t, "udp", e.udp, "www.example.net.", dns.TypeA)
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if v := obstest.Metric(t, e.reg, "meshagent_xds_relay_dns_failures_total", map[string]string{"protocol": "udp", "reason": "upstream"}); v != 1 {
		t.Fatalf("failures = %v, want 1", v)
	}
}

func TestBadNameTableChangesNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Config{Addr: "127.0.0.1:0", ResolvConf: "/nonexistent", Namespace: "default"}, reg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	if err := h.Handle(context.Background(), []*anypb.Any{nds.Any(table)}); err != nil {
		t.Fatal(err)
	}
	for name, res := range map[string]*anypb.Any{
		"bad ip":     nds.Any(nds.Table{"x.example": {IPs: []string{"10.0.0.300"}}}),
		"bad host":   nds.Any(nds.Table{"bad host!": {IPs: []string{"10.0.0.1"}}}),
		"wrong type": {TypeUrl: "type.googleapis.com/other", Value: nds.Marshal(table)},
		"malformed":  {TypeUrl: nds.TypeURL, Value: []byte{0x0a, 0x40}},
	} {
		if err := h.Handle(context.Background(), []*anypb.Any{res}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if e, _ := s.table.Load().find("reviews.default.svc.cluster.local.", nil); e == nil || e.v4[0].String() != "10.96.0.20" {
		t.Fatal("a rejected table replaced the good one")
	}
	if v := obstest.Metric(t, reg, "meshagent_xds_relay_dns_table_hosts", nil); v != 3 {
		t.Fatalf("table hosts = %v, want 3", v)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{Addr: "nope", ResolvConf: "/etc/resolv.conf"}, nil, hclog.NewNullLogger()); err == nil {
		t.Error("bad address accepted")
	}
	if _, err := New(Config{Addr: "127.0.0.1:0"}, nil, hclog.NewNullLogger()); err == nil {
		t.Error("empty resolv.conf path accepted")
	}
}
