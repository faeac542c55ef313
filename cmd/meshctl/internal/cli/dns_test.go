package cli

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/miekg/dns"
)

// startDNS is a real DNS server on loopback standing in for a pod's proxy: it
// answers demo-backend. authoritatively, as the proxy answers from the name
// table, and everything else not authoritatively, as a forwarded answer.
func startDNS(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		q := r.Question[0]
		m.Authoritative = q.Name == "demo-backend."
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(127, 0, 0, 1)})
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

func TestDNSCommand(t *testing.T) {
	addr := startDNS(t)
	dir := t.TempDir()
	if err := stackfile.Write(dir, &stackfile.Stack{Dir: dir, Pods: []stackfile.Pod{{ID: "demo-0", DNS: addr}}}); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "dns", "-dir", dir, "demo-backend")
	if err != nil || !strings.Contains(out, "demo-backend. A 127.0.0.1") || !strings.Contains(out, "from the mesh's name table") || !strings.Contains(out, "demo-0's DNS proxy") {
		t.Fatalf("dns via stack.json: %q %v", out, err)
	}
	out, err = run(t, "dns", "-server", addr, "example.com")
	if err != nil || !strings.Contains(out, "forwarded to resolv.conf's resolvers") {
		t.Fatalf("dns -server: %q %v", out, err)
	}
	for _, args := range [][]string{{"dns"}, {"dns", "-server", addr, "-type", "BOGUS", "x"}, {"dns", "-dir", dir, "-pod", "nope", "x"}} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	lines := demoLookups(context.Background(), &stackfile.Stack{Pods: []stackfile.Pod{{ID: "demo-0", DNS: addr}, {ID: "no-dns"}}}, "demo-backend", time.Second)
	if len(lines) != 1 || !strings.Contains(lines["demo-0"], "127.0.0.1 (from the mesh's name table)") {
		t.Fatalf("demo lookups %v", lines)
	}
}
