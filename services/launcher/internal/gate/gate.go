// Package gate holds Envoy back until the pod can serve: sds-edge's socket
// answers and sds-edge holds the workload certificate (`default`, not expired)
// and the trust bundle (`ROOTCA`) — asked of its /readyz, which reports exactly
// that, not merely dialled — and xds-relay is up with its upstream. It waits a
// bounded time, says at INFO what it is still waiting for, and fails naming what
// is missing.
//
// It speaks HTTP only: asking over SDS would link gRPC into the launcher and
// make sds-edge answer (and publish sds.pushed for) a stream per check.
package gate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
)

// The SDS resources Envoy needs before it can serve mTLS, as Istio names them.
const (
	CertName = "default"
	RootName = "ROOTCA"
)

// Config says what to wait for.
type Config struct {
	Pod       string
	SDSSocket string
	// SDSReadyURL is sds-edge's /readyz: 200 once it holds default and ROOTCA.
	SDSReadyURL string
	XDSSocket   string
	// RelayReadyURL is xds-relay's /readyz; empty: only dial its socket.
	RelayReadyURL string
	// SkipRelay: no relay to wait for (proxyless mode still needs it: leave false).
	SkipRelay bool
	Wait      time.Duration // the bound on the whole wait
	Every     time.Duration // between attempts, at most (the first come sooner); 0: 200ms
	Report    time.Duration // between INFO lines while waiting; 0: 5s
}

// Gate answers "may Envoy start?".
type Gate struct {
	cfg   Config
	clock clock.Clock
	log   hclog.Logger
	http  *http.Client

	mu      sync.Mutex
	checked time.Time // when last is from
	last    []string
}

// Recent is Missing, answered from the last check (Wait's, while it waits) when it
// is younger than maxAge: readiness probes come every few seconds, and each
// check is two dials and two HTTP requests to the pod's other services.
func (g *Gate) Recent(ctx context.Context, maxAge time.Duration) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := g.clock.Now(); g.checked.IsZero() || now.Sub(g.checked) >= maxAge {
		g.last, g.checked = g.Missing(ctx), now
	}
	return g.last
}

// Refresh checks now (Missing) and keeps the answer for Recent.
func (g *Gate) Refresh(ctx context.Context) []string {
	missing := g.Missing(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.last, g.checked = missing, g.clock.Now()
	return missing
}

// New returns a gate; it does nothing until Wait or Check.
func New(cfg Config, clk clock.Clock, log hclog.Logger) *Gate {
	if cfg.Every <= 0 {
		cfg.Every = 200 * time.Millisecond
	}
	if cfg.Report <= 0 {
		cfg.Report = 5 * time.Second
	}
	return &Gate{cfg: cfg, clock: clk, log: log, http: &http.Client{Timeout: 2 * time.Second}}
}

// Missing lists what the pod does not have yet, empty when Envoy may start.
func (g *Gate) Missing(ctx context.Context) []string {
	var missing []string
	missing = append(missing, g.secrets(ctx)...)
	if !g.cfg.SkipRelay {
		if m := g.relay(ctx); m != "" {
			missing = append(missing, m)
		}
	}
	return missing
}

// secrets checks sds-edge: its socket answers and its /readyz says it holds
// default and ROOTCA. sds-edge words a missing one "<name> not available yet";
// any other refusal (an expired certificate, still starting) is named as it says it.
func (g *Gate) secrets(ctx context.Context) []string {
	cert := "sds-edge certificate " + CertName + " (" + g.cfg.SDSSocket + ")"
	root := "sds-edge trust bundle " + RootName
	if err := dialUnix(ctx, g.cfg.SDSSocket); err != nil {
		return []string{fmt.Sprintf("sds-edge socket %s (%v)", g.cfg.SDSSocket, err)}
	}
	code, body, err := g.get(ctx, g.cfg.SDSReadyURL)
	switch {
	case err != nil:
		return []string{fmt.Sprintf("%s, %s (sds-edge readiness %s: %v)", cert, root, g.cfg.SDSReadyURL, err)}
	case code == http.StatusOK:
		return nil
	}
	var missing []string
	if strings.Contains(body, CertName+" not available") {
		missing = append(missing, cert)
	}
	if strings.Contains(body, RootName+" not available") {
		missing = append(missing, root)
	}
	if len(missing) == 0 {
		missing = append(missing, fmt.Sprintf("sds-edge not ready, so no usable certificate %s (%s: %d %s)", CertName, g.cfg.SDSReadyURL, code, body))
	}
	return missing
}

// get fetches url, returning its status and (trimmed, bounded) body.
func (g *Gate) get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := g.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// relay checks xds-relay: its socket answers and its /readyz says it is ready,
// which it is once it has reached its discovery server (the upstream check).
func (g *Gate) relay(ctx context.Context) string {
	if err := dialUnix(ctx, g.cfg.XDSSocket); err != nil {
		return fmt.Sprintf("xds-relay socket %s (%v)", g.cfg.XDSSocket, err)
	}
	if g.cfg.RelayReadyURL == "" {
		return ""
	}
	code, body, err := g.get(ctx, g.cfg.RelayReadyURL)
	if err != nil {
		return fmt.Sprintf("xds-relay readiness %s (%v)", g.cfg.RelayReadyURL, err)
	}
	if code != http.StatusOK {
		// xds-relay's /readyz names each failing check; "upstream" is its
		// discovery server not reached yet.
		what := "xds-relay not ready"
		if strings.Contains(body, "upstream") {
			what = "xds-relay has no upstream"
		}
		return fmt.Sprintf("%s (%s: %d %s)", what, g.cfg.RelayReadyURL, code, body)
	}
	return ""
}

func dialUnix(ctx context.Context, path string) error {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := d.DialContext(dctx, "unix", path)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			return op.Err
		}
		return err
	}
	return c.Close()
}

// firstEvery is the wait before Wait's second check; it doubles up to Every.
const firstEvery = 10 * time.Millisecond

// ErrNotReady is what Wait returns (wrapped, naming what is missing) when the
// bound passes.
var ErrNotReady = errors.New("pod not ready for envoy")

// Wait polls, sooner at first, until nothing is missing, ctx ends (ctx.Err()) or
// the bound passes (ErrNotReady naming what is missing).
func (g *Gate) Wait(ctx context.Context) error {
	start := g.clock.Now()
	deadline := g.clock.NewTimer(g.cfg.Wait)
	defer deadline.Stop()
	lastReport, first := start, true
	var missing []string
	// The first checks come quickly (firstEvery, doubling up to Every): a pod's
	// certificate usually arrives within tens of milliseconds of its start.
	poll := backoff.Policy{First: min(firstEvery, g.cfg.Every), Max: g.cfg.Every}.Start()
	for {
		missing = g.Missing(ctx)
		g.mu.Lock()
		g.last, g.checked = missing, g.clock.Now()
		g.mu.Unlock()
		if len(missing) == 0 {
			g.log.Info("pod ready for envoy", "waited", g.clock.Now().Sub(start).Round(time.Millisecond))
			return nil
		}
		if now := g.clock.Now(); first || now.Sub(lastReport) >= g.cfg.Report {
			g.log.Info("waiting before starting envoy", "missing", strings.Join(missing, "; "),
				"waited", now.Sub(start).Round(time.Second), "limit", g.cfg.Wait)
			lastReport, first = now, false
		}
		next := g.clock.NewTimer(poll.Next())
		select {
		case <-ctx.Done():
			next.Stop()
			return ctx.Err()
		case <-deadline.C():
			next.Stop()
			return fmt.Errorf("%w after %s: missing %s", ErrNotReady, g.cfg.Wait, strings.Join(missing, "; "))
		case <-next.C():
		}
	}
}
