package dashboard

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// hostGuard answers only requests addressed to one of the dashboard's own names.
// Without it, DNS rebinding reads the inventory: a page from evil.example, its
// name re-pointed at 127.0.0.1, fetches http://evil.example:9080/api/inventory as
// a same-origin request, and the browser hands it the answer. The Host header of
// such a request is the attacker's name, so a server that answers only its own
// names gives it nothing. An IP literal cannot be rebound (no DNS is involved),
// so the address the dashboard is bound to always passes; so do
// localhost/127.0.0.1/[::1] when it listens on loopback (or on every address),
// the host name of -http-addr, and the names configured with -allowed-hosts.
type hostGuard struct {
	names   map[string]bool // lower case, no port, IPv6 without brackets
	anyIP   bool            // bound to every address: any IP literal is one of ours
	loopIPs bool            // bound to loopback: any loopback IP is ours
	next    http.Handler
}

// newHostGuard builds the guard for a server configured with listen (its
// -http-addr), bound to bound (nil before it binds), also answering extra.
func newHostGuard(listen string, bound net.Addr, extra []string, next http.Handler) *hostGuard {
	g := &hostGuard{names: map[string]bool{}, next: next}
	add := func(h string) {
		if h = normHost(h); h != "" {
			g.names[h] = true
		}
	}
	for _, h := range extra {
		add(h)
	}
	var ips []netip.Addr
	if h, _, err := net.SplitHostPort(listen); err == nil {
		if ip, err := netip.ParseAddr(h); err == nil {
			ips = append(ips, ip)
		} else if h == "" {
			g.anyIP = true
		} else {
			add(h)
		}
	}
	if ta, ok := bound.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			ips = append(ips, ip.Unmap())
		}
	}
	for _, ip := range ips {
		switch {
		case ip.IsUnspecified():
			g.anyIP = true
		case ip.IsLoopback():
			g.loopIPs = true
		}
		add(ip.String())
	}
	if g.anyIP || g.loopIPs {
		add("localhost")
	}
	return g
}

// normHost is a Host header (or a configured name) without its port, brackets, a
// trailing dot and case.
func normHost(h string) string {
	h = strings.TrimSpace(h)
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// allowed reports whether host (a request's Host) names this dashboard.
func (g *hostGuard) allowed(host string) bool {
	h := normHost(host)
	if h == "" {
		return false
	}
	if g.names[h] {
		return true
	}
	ip, err := netip.ParseAddr(h)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	return g.anyIP || (g.loopIPs && ip.IsLoopback())
}

func (g *hostGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.allowed(r.Host) {
		// 421 Misdirected Request: this server does not answer for that name. The
		// body says how to add one and echoes nothing of the inventory.
		http.Error(w, "misdirected request: this dashboard does not answer for that host name (add it with -allowed-hosts)",
			http.StatusMisdirectedRequest)
		return
	}
	g.next.ServeHTTP(w, r)
}
