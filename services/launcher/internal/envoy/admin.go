// Package envoy runs Envoy for the launcher: the command line Istio's agent gives it,
// the process (optionally as another uid/gid, with its exit code or signal), and the
// admin API calls the launcher makes: /ready, /stats, /drain_listeners,
// /quitquitquit and /stats/prometheus.
package envoy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Admin calls Envoy's admin API on one address (host:port).
type Admin struct {
	Addr   string
	Client *http.Client // nil: one with a 2 s timeout per call
}

func (a Admin) client() *http.Client {
	if a.Client != nil {
		return a.Client
	}
	return &http.Client{Timeout: 2 * time.Second}
}

func (a Admin) do(ctx context.Context, method, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+a.Addr+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("envoy admin %s %s: %w", method, path, err)
	}
	return resp, nil
}

// call makes one request and reads at most 1 MiB of the answer.
func (a Admin) call(ctx context.Context, method, path string) (int, string, error) {
	resp, err := a.do(ctx, method, path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// Ready reports nil when Envoy's /ready answers 200 (state LIVE), and else an
// error with the state Envoy reports (PRE_INITIALIZING, INITIALIZING, DRAINING).
func (a Admin) Ready(ctx context.Context) error {
	code, body, err := a.call(ctx, http.MethodGet, "/ready")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("envoy not ready: %d %s", code, strings.TrimSpace(body))
	}
	return nil
}

// DrainListeners asks Envoy to drain its listeners gracefully; inboundOnly leaves
// outbound listeners alone, as Istio does for sidecars (the app may still call out
// while its callers go away).
func (a Admin) DrainListeners(ctx context.Context, inboundOnly bool) error {
	path := "/drain_listeners?graceful"
	if inboundOnly {
		path += "&inboundonly"
	}
	code, body, err := a.call(ctx, http.MethodPost, path)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("envoy drain_listeners: %d %s", code, strings.TrimSpace(body))
	}
	return nil
}

// Quit asks Envoy to exit now (/quitquitquit).
func (a Admin) Quit(ctx context.Context) error {
	code, body, err := a.call(ctx, http.MethodPost, "/quitquitquit")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("envoy quitquitquit: %d %s", code, strings.TrimSpace(body))
	}
	return nil
}

// ActiveConnections sums Envoy's listener.<name>.downstream_cx_active gauges,
// leaving out the admin listener and the listeners named in exclude (Envoy names a
// listener by its address, 0.0.0.0_15090): those are the prober's and scraper's
// connections, not the app's traffic.
func (a Admin) ActiveConnections(ctx context.Context, exclude ...string) (int, error) {
	resp, err := a.do(ctx, http.MethodGet, "/stats?usedonly&filter=downstream_cx_active$")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("envoy stats: %d", resp.StatusCode)
	}
	return SumActive(io.LimitReader(resp.Body, 4<<20), exclude...)
}

// SumActive parses Envoy's /stats text ("name: value" lines) and sums the
// downstream_cx_active gauges of listeners other than admin and exclude.
func SumActive(r io.Reader, exclude ...string) (int, error) {
	total := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ": ")
		if !ok || !strings.HasPrefix(name, "listener.") || !strings.HasSuffix(name, ".downstream_cx_active") {
			continue
		}
		listener := strings.TrimSuffix(strings.TrimPrefix(name, "listener."), ".downstream_cx_active")
		if listener == "admin" || contains(exclude, listener) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil {
			return 0, fmt.Errorf("envoy stats: %s: %w", name, err)
		}
		total += n
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("envoy stats: %w", err)
	}
	return total, nil
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}
