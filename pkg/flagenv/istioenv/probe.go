package istioenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ReadinessProbe is Istio's networking.v1alpha3.ReadinessProbe, ProxyConfig's
// readinessProbe: how the agent probes the app to report its health to the
// control plane (Istio's workload health checks, for VMs). Zero numbers are
// unset; exactly one of the four methods is set.
type ReadinessProbe struct {
	InitialDelaySeconds int32
	TimeoutSeconds      int32
	PeriodSeconds       int32
	SuccessThreshold    int32
	FailureThreshold    int32
	HTTPGet             *HTTPGetProbe
	TCPSocket           *TCPSocketProbe
	Exec                *ExecProbe
	GRPC                *GRPCProbe
}

// HTTPGetProbe is Istio's HTTPHealthCheckConfig.
type HTTPGetProbe struct {
	Path, Host, Scheme string
	Port               uint32
	Headers            []HTTPHeader
}

// HTTPHeader is Istio's HTTPHeader.
type HTTPHeader struct{ Name, Value string }

// TCPSocketProbe is Istio's TCPHealthCheckConfig.
type TCPSocketProbe struct {
	Host string
	Port uint32
}

// ExecProbe is Istio's ExecHealthCheckConfig.
type ExecProbe struct{ Command []string }

// GRPCProbe is Istio's GrpcHealthCheckConfig.
type GRPCProbe struct {
	Port    uint32
	Service string
}

// readinessProbe reads a ReadinessProbe as protojson does (lowerCamel or proto
// names, int32 as numbers or decimal strings, null as unset). A field the message
// lacks, two methods, none, a negative number or a port outside 1-65535 is an error.
func readinessProbe(v json.RawMessage) (*ReadinessProbe, error) {
	fields, err := object(v)
	if err != nil {
		return nil, err
	}
	p := &ReadinessProbe{}
	var errs, methods []string
	for name, fv := range fields {
		var err error
		switch name {
		case "initialDelaySeconds":
			p.InitialDelaySeconds, err = nonNegative(fv)
		case "timeoutSeconds":
			p.TimeoutSeconds, err = nonNegative(fv)
		case "periodSeconds":
			p.PeriodSeconds, err = nonNegative(fv)
		case "successThreshold":
			p.SuccessThreshold, err = nonNegative(fv)
		case "failureThreshold":
			p.FailureThreshold, err = nonNegative(fv)
		case "httpGet":
			methods = append(methods, name)
			p.HTTPGet, err = httpGetProbe(fv)
		case "tcpSocket":
			methods = append(methods, name)
			p.TCPSocket, err = tcpSocketProbe(fv)
		case "exec":
			methods = append(methods, name)
			p.Exec, err = execProbe(fv)
		case "grpc":
			methods = append(methods, name)
			p.GRPC, err = grpcProbe(fv)
		default:
			err = errors.New("not a field of Istio's ReadinessProbe")
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", name, err))
		}
	}
	switch len(methods) {
	case 0:
		errs = append(errs, "want one of httpGet, tcpSocket, exec, grpc")
	case 1:
	default:
		sort.Strings(methods)
		errs = append(errs, "more than one of "+strings.Join(methods, ", "))
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		return nil, errors.New(strings.Join(errs, "; "))
	}
	return p, nil
}

func httpGetProbe(v json.RawMessage) (*HTTPGetProbe, error) {
	fields, err := object(v)
	if err != nil {
		return nil, err
	}
	g := &HTTPGetProbe{}
	for name, fv := range fields {
		switch name {
		case "path":
			err = json.Unmarshal(fv, &g.Path)
		case "host":
			err = json.Unmarshal(fv, &g.Host)
		case "scheme":
			if err = json.Unmarshal(fv, &g.Scheme); err == nil && g.Scheme != "" &&
				!strings.EqualFold(g.Scheme, "http") && !strings.EqualFold(g.Scheme, "https") {
				err = fmt.Errorf("%q: want HTTP or HTTPS", g.Scheme)
			}
		case "port":
			g.Port, err = probePort(fv)
		case "httpHeaders":
			var hs []map[string]json.RawMessage
			if err = json.Unmarshal(fv, &hs); err != nil {
				break
			}
			for _, h := range hs {
				var hh HTTPHeader
				for k, hv := range h {
					switch jsonName(k) {
					case "name":
						err = json.Unmarshal(hv, &hh.Name)
					case "value":
						err = json.Unmarshal(hv, &hh.Value)
					default:
						err = fmt.Errorf("%s: not a field of Istio's HTTPHeader", k)
					}
					if err != nil {
						break
					}
				}
				if err != nil {
					break
				}
				g.Headers = append(g.Headers, hh)
			}
		default:
			err = errors.New("not a field of Istio's HTTPHealthCheckConfig")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if g.Port == 0 {
		return nil, errors.New("port: required")
	}
	return g, nil
}

func tcpSocketProbe(v json.RawMessage) (*TCPSocketProbe, error) {
	fields, err := object(v)
	if err != nil {
		return nil, err
	}
	t := &TCPSocketProbe{}
	for name, fv := range fields {
		switch name {
		case "host":
			err = json.Unmarshal(fv, &t.Host)
		case "port":
			t.Port, err = probePort(fv)
		default:
			err = errors.New("not a field of Istio's TCPHealthCheckConfig")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if t.Port == 0 {
		return nil, errors.New("port: required")
	}
	return t, nil
}

func execProbe(v json.RawMessage) (*ExecProbe, error) {
	fields, err := object(v)
	if err != nil {
		return nil, err
	}
	e := &ExecProbe{}
	for name, fv := range fields {
		if name != "command" {
			return nil, fmt.Errorf("%s: not a field of Istio's ExecHealthCheckConfig", name)
		}
		if err := json.Unmarshal(fv, &e.Command); err != nil {
			return nil, fmt.Errorf("command: %w", err)
		}
	}
	if len(e.Command) == 0 || e.Command[0] == "" {
		return nil, errors.New("command: required")
	}
	return e, nil
}

func grpcProbe(v json.RawMessage) (*GRPCProbe, error) {
	fields, err := object(v)
	if err != nil {
		return nil, err
	}
	g := &GRPCProbe{}
	for name, fv := range fields {
		switch name {
		case "port":
			g.Port, err = probePort(fv)
		case "service":
			err = json.Unmarshal(fv, &g.Service)
		default:
			err = errors.New("not a field of Istio's GrpcHealthCheckConfig")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if g.Port == 0 {
		return nil, errors.New("port: required")
	}
	return g, nil
}

// object reads v as a JSON object by protojson's field names (a proto name is
// taken as its lowerCamel one); null fields are left out.
func object(v json.RawMessage) (map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil || raw == nil {
		return nil, fmt.Errorf("want an object: %.40s", v)
	}
	out := make(map[string]json.RawMessage, len(raw))
	for k, fv := range raw {
		name := jsonName(k)
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s: given twice", name)
		}
		if !isNull(fv) {
			out[name] = fv
		}
	}
	return out, nil
}

func nonNegative(v json.RawMessage) (int32, error) {
	n, err := int32Value(v)
	if err == nil && n < 0 {
		err = fmt.Errorf("%d is negative", n)
	}
	return n, err
}

// probePort reads a uint32 port; 0 is unset (the caller requires one).
func probePort(v json.RawMessage) (uint32, error) {
	n, err := int32Value(v)
	if err == nil && (n < 0 || n > 65535) {
		err = fmt.Errorf("port %d out of range", n)
	}
	return uint32(n), err
}
