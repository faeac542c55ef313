// Package appprobe probes an application the ways Kubernetes and Istio do: an
// HTTP GET, a TCP connect, the standard gRPC health check, or a command. The
// launcher forwards the app's Kubernetes probes with it (ISTIO_KUBE_APP_PROBERS),
// and xds-relay probes the app as ProxyConfig's readinessProbe says (Istio's
// workload health checks). Every probe is bounded by its context.
package appprobe

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// HTTPGet is an HTTP GET probe.
type HTTPGet struct {
	Scheme  string // http (default) or https, any case
	Host    string
	Port    int
	Path    string // "/" when empty; a leading "/" is added when missing
	Headers []Header
	// UserAgent is sent unless Headers name one.
	UserAgent string
}

// Header is one header of an HTTP probe; Host sets the request's host.
type Header struct{ Name, Value string }

// ErrStatus wraps the error of an HTTP probe the app answered outside [200,400).
var ErrStatus = errors.New("app answered outside 200-399")

// HTTP runs g and returns the app's status code (0 when it did not answer). The
// error is nil for a status in [200,400), as the kubelet and Istio's agent count
// success; an HTTPS probe does not verify the app's certificate (as theirs).
// Redirects are not followed: a 3xx is a success of its own.
func HTTP(ctx context.Context, g HTTPGet) (int, error) {
	scheme := "http"
	tr := &http.Transport{DisableKeepAlives: true}
	if strings.EqualFold(g.Scheme, "HTTPS") {
		scheme = "https"
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // a probe of the pod's own app, as the kubelet's
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(g.Host, strconv.Itoa(g.Port))+path, nil)
	if err != nil {
		return 0, err
	}
	if g.UserAgent != "" {
		req.Header.Set("User-Agent", g.UserAgent)
	}
	for _, h := range g.Headers {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		if strings.EqualFold(h.Name, "User-Agent") {
			req.Header.Del("User-Agent")
		}
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return resp.StatusCode, fmt.Errorf("%w: %d", ErrStatus, resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// TCP succeeds when a TCP connection to host:port opens.
func TCP(ctx context.Context, host string, port int) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	return c.Close()
}

// Exec succeeds when command exits 0; it is killed when ctx ends.
func Exec(ctx context.Context, command []string) error {
	if len(command) == 0 {
		return errors.New("exec probe: no command")
	}
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	err := cmd.Run()
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("command timed out: %w", err)
	}
	return err
}

// GRPC is the standard gRPC health check (grpc.health.v1.Health/Check of
// service, "" for the server's) over plaintext HTTP/2, made as one request with
// the message encoded by hand, so that a caller need not link grpc-go for one
// unary call. It succeeds when the answer is SERVING.
func GRPC(ctx context.Context, host string, port int, service string) error {
	// HealthCheckRequest{service = 1}, behind gRPC's 5-byte frame header
	// (uncompressed flag, big-endian length).
	msg := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), service)
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/grpc.health.v1.Health/Check"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(append(frame, msg...)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := h2c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return fmt.Errorf("app grpc health: %w", err)
	}
	// A trailers-only answer (an error) carries grpc-status in the headers.
	code, text := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
	if code == "" {
		code, text = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
	}
	if resp.StatusCode != http.StatusOK || code != "0" {
		return fmt.Errorf("app grpc health: http %d, grpc-status %q %s", resp.StatusCode, code, text)
	}
	status, err := healthStatus(body)
	if err != nil {
		return fmt.Errorf("app grpc health: %w", err)
	}
	if status != servingStatus {
		return fmt.Errorf("app grpc health: %s", healthStatusName(status))
	}
	return nil
}

// h2c speaks HTTP/2 without TLS, as gRPC does on a plaintext port.
var h2c = func() *http.Client {
	var pr http.Protocols
	pr.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &pr, DisableKeepAlives: true}}
}()

// servingStatus is grpc.health.v1.HealthCheckResponse.SERVING.
const servingStatus = 1

// healthStatus reads HealthCheckResponse{status = 1} out of one gRPC frame.
func healthStatus(body []byte) (uint64, error) {
	if len(body) < 5 || body[0] != 0 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		return 0, fmt.Errorf("not one uncompressed gRPC message (%d bytes)", len(body))
	}
	b := body[5:]
	var status uint64 // absent: UNKNOWN (0)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return 0, protowire.ParseError(m)
			}
			status, b = v, b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return 0, protowire.ParseError(m)
		}
		b = b[m:]
	}
	return status, nil
}

func healthStatusName(s uint64) string {
	switch s {
	case 0:
		return "UNKNOWN"
	case 2:
		return "NOT_SERVING"
	case 3:
		return "SERVICE_UNKNOWN"
	}
	return fmt.Sprintf("status %d", s)
}
