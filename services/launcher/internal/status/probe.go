package status

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/appprobe"
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
		g := p.HTTPGet
		host := g.Host
		if host == "" {
			host = p.host
		}
		hs := make([]appprobe.Header, len(g.HTTPHeaders))
		for i, h := range g.HTTPHeaders {
			hs[i] = appprobe.Header{Name: h.Name, Value: h.Value}
		}
		code, err := appprobe.HTTP(ctx, appprobe.HTTPGet{Scheme: g.Scheme, Host: host, Port: int(g.Port), Path: g.Path,
			Headers: hs, UserAgent: "kube-probe/1.0 (meshagent launcher)"})
		if code == 0 {
			code = http.StatusInternalServerError
		}
		return code, err
	case p.TCPSocket != nil:
		host := p.TCPSocket.Host
		if host == "" {
			host = p.host
		}
		if err := appprobe.TCP(ctx, host, int(p.TCPSocket.Port)); err != nil {
			return http.StatusInternalServerError, err
		}
		return http.StatusOK, nil
	default:
		svc := ""
		if p.GRPC.Service != nil {
			svc = *p.GRPC.Service
		}
		if err := appprobe.GRPC(ctx, p.host, p.GRPC.Port, svc); err != nil {
			return http.StatusInternalServerError, err
		}
		return http.StatusOK, nil
	}
}
