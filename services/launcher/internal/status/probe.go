package status

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/encoding/protowire"
)

// Probers are the app's probes by status-port path, as ISTIO_KUBE_APP_PROBERS
// carries them: {"/app-health/web/readyz": {"httpGet": {...}, "timeoutSeconds": 1}}.
type Probers map[string]*Prober

// Prober is one Kubernetes probe of the app, forwarded by the status server.
type Prober struct {
	HTTPGet *struct {
		Path        string   `json:"path"`
		Port        intOrStr `json:"port"`
		Host        string   `json:"host"`
		Scheme      string   `json:"scheme"`
		HTTPHeaders []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"httpHeaders"`
	} `json:"httpGet"`
	TCPSocket *struct {
		Port intOrStr `json:"port"`
		Host string   `json:"host"`
	} `json:"tcpSocket"`
	GRPC *struct {
		Port    int     `json:"port"`
		Service *string `json:"service"`
	} `json:"grpc"`
	TimeoutSeconds int `json:"timeoutSeconds"`

	host string // default host: the pod's IP
}

// intOrStr is a port as Kubernetes writes it: a number, or a string of digits (the
// injector resolves named ports before it writes the probers).
type intOrStr int

func (p *intOrStr) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("port %s: want a number 1-65535 (named ports must be resolved)", b)
	}
	*p = intOrStr(n)
	return nil
}

// ParseProbers reads ISTIO_KUBE_APP_PROBERS; host is where probes go when a probe
// names none (the pod's IP). Every path must start with /app-health/ and every
// prober must have exactly one of httpGet, tcpSocket and grpc.
func ParseProbers(s, host string) (Probers, error) {
	if s == "" {
		return nil, nil
	}
	var ps Probers
	if err := json.Unmarshal([]byte(s), &ps); err != nil {
		return nil, fmt.Errorf("-app-probers: %w", err)
	}
	for path, p := range ps {
		if !strings.HasPrefix(path, "/app-health/") {
			return nil, fmt.Errorf("-app-probers: path %q: must start with /app-health/", path)
		}
		n := 0
		for _, set := range []bool{p != nil && p.HTTPGet != nil, p != nil && p.TCPSocket != nil, p != nil && p.GRPC != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("-app-probers: %s: want exactly one of httpGet, tcpSocket, grpc", path)
		}
		if p.GRPC != nil && (p.GRPC.Port <= 0 || p.GRPC.Port > 65535) {
			return nil, fmt.Errorf("-app-probers: %s: grpc port %d", path, p.GRPC.Port)
		}
		if p.HTTPGet != nil && p.HTTPGet.Scheme != "" && !strings.EqualFold(p.HTTPGet.Scheme, "HTTP") && !strings.EqualFold(p.HTTPGet.Scheme, "HTTPS") {
			return nil, fmt.Errorf("-app-probers: %s: scheme %q", path, p.HTTPGet.Scheme)
		}
		p.host = host
	}
	return ps, nil
}

func (p *Prober) timeout() time.Duration {
	if p.TimeoutSeconds <= 0 {
		return time.Second // Kubernetes' default
	}
	return time.Duration(p.TimeoutSeconds) * time.Second
}

func (p *Prober) handler(log hclog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), p.timeout())
		defer cancel()
		code, err := p.probe(ctx)
		if err != nil {
			log.Debug("app probe failed", "path", r.URL.Path, "error", err)
			http.Error(w, err.Error(), code)
			return
		}
		w.WriteHeader(code)
	})
}

// probe runs the probe and returns the status to answer: the app's own for HTTP
// (as Istio does), 200 or 500 for TCP and gRPC.
func (p *Prober) probe(ctx context.Context) (int, error) {
	switch {
	case p.HTTPGet != nil:
		return p.httpProbe(ctx)
	case p.TCPSocket != nil:
		host := p.TCPSocket.Host
		if host == "" {
			host = p.host
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(p.TCPSocket.Port))))
		if err != nil {
			return http.StatusInternalServerError, err
		}
		_ = c.Close()
		return http.StatusOK, nil
	default:
		return p.grpcProbe(ctx)
	}
}

func (p *Prober) httpProbe(ctx context.Context) (int, error) {
	g := p.HTTPGet
	host := g.Host
	if host == "" {
		host = p.host
	}
	scheme := "http"
	tr := &http.Transport{DisableKeepAlives: true}
	if strings.EqualFold(g.Scheme, "HTTPS") {
		scheme = "https"
		// As the kubelet does: an HTTPS probe does not verify the app's certificate.
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(int(g.Port)))+path, nil)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	req.Header.Set("User-Agent", "kube-probe/1.0 (meshagent launcher)")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return resp.StatusCode, fmt.Errorf("app answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// grpcProbe is the standard gRPC health check (grpc.health.v1.Health/Check), made
// as one HTTP/2 cleartext request with the message encoded by hand: the launcher
// does not link grpc-go for one unary call (see docs/architecture.md, one
// executable per pod).
func (p *Prober) grpcProbe(ctx context.Context) (int, error) {
	svc := ""
	if p.GRPC.Service != nil {
		svc = *p.GRPC.Service
	}
	// HealthCheckRequest{service = 1}, behind gRPC's 5-byte frame header
	// (uncompressed flag, big-endian length).
	msg := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), svc)
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	url := "http://" + net.JoinHostPort(p.host, strconv.Itoa(p.GRPC.Port)) + "/grpc.health.v1.Health/Check"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(append(frame, msg...)))
	if err != nil {
		return http.StatusInternalServerError, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := h2c.Do(req)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return http.StatusInternalServerError, fmt.Errorf("app grpc health: %w", err)
	}
	// A trailers-only answer (an error) carries grpc-status in the headers.
	code, text := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
	if code == "" {
		code, text = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
	}
	if resp.StatusCode != http.StatusOK || code != "0" {
		return http.StatusInternalServerError, fmt.Errorf("app grpc health: http %d, grpc-status %q %s", resp.StatusCode, code, text)
	}
	status, err := healthStatus(body)
	if err != nil {
		return http.StatusInternalServerError, fmt.Errorf("app grpc health: %w", err)
	}
	if status != servingStatus {
		return http.StatusInternalServerError, fmt.Errorf("app grpc health: %s", healthStatusName(status))
	}
	return http.StatusOK, nil
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
