// Package waitready is `launcher wait` (and `meshagent wait`): Istio's
// `pilot-agent wait`, which an app container's postStart hook runs
// (holdApplicationUntilProxyStarts) so that the app starts only once the pod's
// proxy is ready. It polls the status port's readiness URL until it answers 200
// or the timeout passes; the exit code is Istio's: 0 ready, 1 not ready in time or
// a bad flag.
package waitready

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

// Config is the wait's flags, with Istio's names and defaults.
type Config struct {
	TimeoutSeconds int    // --timeoutSeconds
	PeriodMillis   int    // --periodMillis
	URL            string // --url
}

// Default is Istio's defaults.
func Default() Config {
	return Config{TimeoutSeconds: 60, PeriodMillis: 500, URL: "http://localhost:15020/healthz/ready"}
}

// Load reads the flags (Istio's have no env vars; neither do these).
func Load(args []string) (Config, error) {
	c := Default()
	fs := flagenv.New("wait", nil)
	fs.Int(&c.TimeoutSeconds, "timeoutSeconds", "", c.TimeoutSeconds, "how long to wait for the proxy to be ready, in seconds (Istio: pilot-agent wait --timeoutSeconds)")
	fs.Int(&c.PeriodMillis, "periodMillis", "", c.PeriodMillis, "how often to ask, in milliseconds; also each request's timeout (Istio: --periodMillis)")
	fs.String(&c.URL, "url", "", c.URL, "the readiness URL: the launcher's status port /healthz/ready (Istio: --url)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var p flagenv.Problems
	p.Check(c.TimeoutSeconds > 0, "--timeoutSeconds: must be positive, got %d", c.TimeoutSeconds)
	p.Check(c.PeriodMillis > 0, "--periodMillis: must be positive, got %d", c.PeriodMillis)
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.Addf("--url: %q: want an http(s) URL", c.URL)
	}
	return c, p.Err()
}

// ErrNotReady is returned when the timeout passes before the URL answers 200.
var ErrNotReady = errors.New("proxy not ready")

// Wait polls c.URL every period on clk until it answers 200 (nil), the timeout
// passes or ctx ends (ErrNotReady, with the last answer). It writes Istio's
// progress lines to out.
func Wait(ctx context.Context, c Config, clk clock.Clock, out io.Writer) error {
	timeout := time.Duration(c.TimeoutSeconds) * time.Second
	period := time.Duration(c.PeriodMillis) * time.Millisecond
	fmt.Fprintf(out, "Waiting for Envoy proxy to be ready (timeout: %d seconds)...\n", c.TimeoutSeconds)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: period}
	var last error
	for {
		next := clk.NewTimer(period) // a period from this probe's start, as a ticker
		err := probe(ctx, client, c.URL)
		if err == nil {
			next.Stop()
			fmt.Fprintln(out, "Envoy is ready!")
			return nil
		}
		if last == nil || ctx.Err() == nil { // keep the last answer, not the timeout's cut
			last = err
		}
		select {
		case <-ctx.Done():
			next.Stop()
			return fmt.Errorf("%w after %s: %w", ErrNotReady, timeout, last)
		case <-next.C():
		}
	}
}

// probe is one GET of u: nil on 200.
func probe(ctx context.Context, client *http.Client, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", u, resp.Status)
	}
	return nil
}

// Run is the command: Load, then Wait on the wall clock. Any error exits 1
// (pkg/lifecycle.Main), as pilot-agent wait does.
func Run(ctx context.Context, args []string, out io.Writer) error {
	c, err := Load(args)
	if err != nil {
		return err
	}
	return Wait(ctx, c, clock.Real{}, out)
}
