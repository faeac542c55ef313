// Package testkit holds the helpers every meshagent module's tests use: polling
// for a condition instead of sleeping, and a free loopback address. It is imported
// by tests only.
package testkit

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Timeout is how long Eventually waits: long enough for a loaded CI machine, short
// enough that a hung test fails with a message rather than the go test timeout.
// A bound, not a wait: only a failing test takes it. 15 s was not enough for
// `make test` beside two busy loops and a compose suite (2026-12-07:
// TestSplitBrainSendsOnce's 200 schedules took longer).
const Timeout = time.Minute

// Eventually polls cond until it holds, and fails t after Timeout with a message
// naming what it waited for.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, Timeout, what, cond)
}

// EventuallyWithin is Eventually with its own deadline. It polls often at first
// (5ms) and less often (up to every 50ms) as the wait grows, so that a quick
// condition is seen at once and a slow one (an HTTP scrape, a subprocess) is not
// hammered.
func EventuallyWithin(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, cond) {
		t.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

// Poll reports whether cond held before within passed, polling as
// EventuallyWithin does; for a caller whose failure message needs more than what
// it waited for (a child's last log lines).
func Poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	wait := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
	return true
}

// Idle waits d — the quiet period a measurement is defined by (memory after the
// pod idled), not a wait for a condition, which is Eventually's — or until ctx
// ends. It reports whether the whole period passed.
func Idle(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// FreeAddr returns a loopback TCP address ("127.0.0.1:port") that was free a
// moment ago, for a server the test starts by address.
//
// The port is below the kernel's ephemeral range (ip_local_port_range): a port the
// kernel picked for bind(":0") would, once freed, be handed out again as the source
// port of any outgoing connection — and a busy test run makes thousands — so the
// server that comes to bind it later can find it taken. Below the range only
// another test's choice can collide, and the choice is random; within one test
// process a port is handed out once (given), since a port handed out but not yet
// bound looks free again — CI once gave the signer's gRPC and the rotator's HTTP
// the same one.
func FreeAddr(t testing.TB) string {
	t.Helper()
	low, high := freePortRange()
	var lastErr error
	for range 50 {
		port := low + rand.IntN(high-low)
		if !given.take(port) {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			addr := ln.Addr().String()
			ln.Close()
			return addr
		}
		lastErr = err
	}
	// Everything tried was taken: fall back to a port the kernel picks.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free address: %v (and below the ephemeral range: %v)", err, lastErr)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// given holds the ports FreeAddr has handed out in this process.
var given = &portSet{m: map[int]bool{}}

type portSet struct {
	mu sync.Mutex
	m  map[int]bool
}

// take reports whether port was not handed out before, and marks it handed out.
func (s *portSet) take(port int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[port] {
		return false
	}
	s.m[port] = true
	return true
}

// freePortRange is where FreeAddr picks from: [10000, the ephemeral range's low
// end), or [10000, 32768) when the range cannot be read or leaves no room.
func freePortRange() (low, high int) {
	low, high = 10000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	f := strings.Fields(string(b))
	if len(f) == 2 {
		if n, err := strconv.Atoi(f[0]); err == nil && n > low+1000 {
			high = n
		}
	}
	return low, high
}

// HTTPGet fetches url and returns its status and body; status 0 and the error's
// text when the request fails, so that a poll can simply retry.
func HTTPGet(url string) (status int, body string) {
	return HTTPGetWithin(url, 0)
}

// HTTPGetWithin is HTTPGet bounded by timeout (0: none): a server that accepts
// and never answers is status 0 after it, not a caller stuck for good.
func HTTPGetWithin(url string, timeout time.Duration) (status int, body string) {
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err.Error()
	}
	return resp.StatusCode, string(b)
}

// ShortDir returns a fresh directory, removed when the test ends, whose path is
// short enough for unix sockets inside it: t.TempDir's path, named after the
// test, often overflows the kernel's 108-byte socket path limit.
func ShortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ma")
	if err != nil {
		t.Fatalf("short dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// StaleSocket leaves a unix socket file at path that nothing listens on, as a
// killed server leaves it.
func StaleSocket(t testing.TB, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}
