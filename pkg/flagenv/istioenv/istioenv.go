// Package istioenv reads what Istio's injection template hands a proxy beyond
// plain env vars: PROXY_CONFIG (the mesh's per-proxy MeshConfig.ProxyConfig, as
// JSON or YAML) and its proxyMetadata, which Istio's agent applies as environment
// variables the container does not set itself.
//
// The decoder is hand-written over the few fields the pod's roles act on: the pod
// roles do not link istio.io/api's generated types (docs/benchmarks.md, "Per-pod
// memory"). Every other ProxyConfig field is known by name and ignored (listed in
// docs/istio.md); a name ProxyConfig does not have is refused, so that a typo is
// not silently dropped. Its tests compare it with istio.io/api's own types.
package istioenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

// Env is the environment variable holding the ProxyConfig.
const Env = "PROXY_CONFIG"

// MaxSize bounds PROXY_CONFIG: Istio's are a few hundred bytes.
const MaxSize = 64 << 10

// ProxyConfig is the part of Istio's ProxyConfig the pod's roles act on. A nil
// pointer or empty string is a field the config does not set.
type ProxyConfig struct {
	DiscoveryAddress         string         // xds-relay -discovery-address
	StatusPort               *int32         // launcher -status-addr; 0: no status server
	ProxyAdminPort           *int32         // launcher -envoy-admin
	DrainDuration            *time.Duration // launcher -drain-duration (Envoy --drain-time-s)
	TerminationDrainDuration *time.Duration // launcher -drain-time
	ParentShutdownDuration   *time.Duration // launcher -parent-shutdown-duration
	BinaryPath               string         // launcher -envoy-binary
	Concurrency              *int32         // launcher -concurrency
	// ControlPlaneAuthPolicy is NONE or MUTUAL_TLS (INHERIT is read as unset):
	// xds-relay's default -xds-tls, plaintext or mtls, as Istio's agent dials.
	ControlPlaneAuthPolicy string
	ProxyMetadata          map[string]string // env vars, below the container's own
	// ReadinessProbe is how xds-relay probes the app to report its health to the
	// control plane (Istio's workload health checks); nil: no health reports.
	ReadinessProbe *ReadinessProbe
	// JSON is the whole ProxyConfig as a JSON object (a YAML one converted), nil
	// when PROXY_CONFIG is unset: the launcher's PROXY_CONFIG node metadata, as
	// Istio's agent puts its ProxyConfig there.
	JSON json.RawMessage
	Set  map[string]bool // every field name given (JSON name)
}

// Used are ProxyConfig's fields (JSON names) that some pod role acts on.
var Used = []string{
	"discoveryAddress", "statusPort", "proxyAdminPort", "drainDuration", "terminationDrainDuration",
	"binaryPath", "concurrency", "proxyMetadata", "controlPlaneAuthPolicy", "readinessProbe",
}

// Ignored are ProxyConfig's other fields (JSON names), with why meshagent ignores
// each; docs/istio.md lists them and a test keeps the two in step.
var Ignored = map[string]string{
	"configPath":                      "the launcher writes Envoy's bootstrap to -bootstrap",
	"serviceCluster":                  "deprecated in Istio; node metadata comes from the pod's labels",
	"availabilityZone":                "deprecated in Istio; locality comes from the control plane",
	"discoveryRefreshDelay":           "deprecated in Istio; ADS pushes",
	"zipkinAddress":                   "deprecated in Istio; tracing is configured by the control plane",
	"connectionSettings":              "applied by the control plane to the inbound clusters it generates",
	"statsdUdpAddress":                "statsd sinks are not generated; use a custom bootstrap",
	"envoyMetricsServiceAddress":      "deprecated in Istio",
	"customConfigFile":                "use the launcher's -custom-bootstrap",
	"statNameLength":                  "Envoy's stat name limit is Envoy's default",
	"proxyBootstrapTemplatePath":      "use the launcher's -bootstrap-template (a Go template, not Istio's)",
	"interceptionMode":                "traffic capture is istio-init's or the CNI's, not the agent's",
	"tracing":                         "tracing is configured by the control plane's listeners, not the bootstrap",
	"sds":                             "deprecated in Istio; sds-edge is always the SDS server",
	"envoyAccessLogService":           "access log services are not generated in the bootstrap",
	"envoyMetricsService":             "metrics services are not generated in the bootstrap",
	"extraStatTags":                   "stat tags are Envoy's defaults",
	"gatewayTopology":                 "a listener setting the control plane applies",
	"tracingServiceName":              "tracing is configured by the control plane",
	"meshId":                          "read from ISTIO_META_MESH_ID",
	"holdApplicationUntilProxyStarts": "the injector's: it adds `meshagent wait` as the app's postStart",
	"caCertificatesPem":               "taken from the control plane's ProxyConfig (PCDS) by xds-relay, not from the env",
	"image":                           "the injector's",
	"privateKeyProvider":              "the key is sds-edge's, in its memory; no CryptoMB/QAT provider",
	"proxyHeaders":                    "a listener setting the control plane applies",
	"proxyStatsMatcher":               "Envoy's stats inclusion is its default",
	"runtimeValues":                   "Envoy runtime layers are not generated; use a custom bootstrap",
	"fileFlushInterval":               "Envoy's access log flush is its default",
	"fileFlushMinSizeKb":              "Envoy's access log flush is its default",
	"statsCompression":                "the status port serves uncompressed stats",
}

// Parse decodes a ProxyConfig in protojson's form (lowerCamel names, or the proto
// names), as Istio's injection template renders it, or as YAML of the same form,
// which Istio's agent also takes (its protomarshal.ApplyYAML turns the YAML into
// JSON with sigs.k8s.io/yaml, as here). An empty s is an empty config.
func Parse(s string) (ProxyConfig, error) {
	var pc ProxyConfig
	if strings.TrimSpace(s) == "" {
		return pc, nil
	}
	if len(s) > MaxSize {
		return pc, fmt.Errorf("%d bytes, more than %d", len(s), MaxSize)
	}
	fields, err := decodeObject(s)
	if err != nil {
		return pc, err
	}
	pc.Set = map[string]bool{}
	var errs, unknown []string
	for k, v := range fields {
		name := jsonName(k)
		if pc.Set[name] {
			errs = append(errs, fmt.Sprintf("%s: given twice", name))
			continue
		}
		pc.Set[name] = true
		if isNull(v) {
			continue
		}
		var err error
		switch name {
		case "discoveryAddress":
			err = json.Unmarshal(v, &pc.DiscoveryAddress)
		case "binaryPath":
			err = json.Unmarshal(v, &pc.BinaryPath)
		case "statusPort":
			pc.StatusPort, err = port(v)
		case "proxyAdminPort":
			pc.ProxyAdminPort, err = port(v)
		case "concurrency":
			var n int32
			if n, err = int32Value(v); err == nil && n < 0 {
				err = fmt.Errorf("%d is negative", n)
			}
			pc.Concurrency = &n
		case "drainDuration":
			pc.DrainDuration, err = duration(v)
		case "terminationDrainDuration":
			pc.TerminationDrainDuration, err = duration(v)
		case "proxyMetadata":
			err = json.Unmarshal(v, &pc.ProxyMetadata)
		case "controlPlaneAuthPolicy":
			pc.ControlPlaneAuthPolicy, err = authPolicy(v)
		case "readinessProbe":
			pc.ReadinessProbe, err = readinessProbe(v)
		default:
			if _, ok := Ignored[name]; !ok {
				unknown = append(unknown, k)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", name, err))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		errs = append(errs, fmt.Sprintf("unknown field(s) %s (not in Istio's ProxyConfig)", strings.Join(unknown, ", ")))
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		return ProxyConfig{}, errors.New(strings.Join(errs, "; "))
	}
	pc.JSON, err = json.Marshal(fields)
	return pc, err
}

// decodeObject reads s as one JSON object, or else as a YAML mapping.
func decodeObject(s string) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if strings.HasPrefix(strings.TrimSpace(s), "{") {
		dec := json.NewDecoder(strings.NewReader(s))
		if err := dec.Decode(&fields); err == nil {
			if dec.More() {
				return nil, errors.New("trailing data after the JSON object")
			}
			return fields, nil
		}
		// Not JSON: a YAML flow mapping ({a: b}) is read below.
	}
	j, err := yaml.YAMLToJSON([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("want a JSON object or a YAML mapping (Istio's ProxyConfig): %w", err)
	}
	fields = nil
	if err := json.Unmarshal(j, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("want a JSON object or a YAML mapping (Istio's ProxyConfig), got %.40s", strings.TrimSpace(s))
	}
	return fields, nil
}

// jsonName is k as protojson's lowerCamel JSON name (k may be the proto name).
func jsonName(k string) string {
	if !strings.Contains(k, "_") {
		return k
	}
	var b strings.Builder
	up := false
	for _, r := range k {
		if r == '_' {
			up = true
			continue
		}
		if up && r >= 'a' && r <= 'z' {
			r -= 'a' - 'A'
		}
		up = false
		b.WriteRune(r)
	}
	return b.String()
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// int32Value reads an int32 as protojson writes it: a number, or a decimal string.
func int32Value(v json.RawMessage) (int32, error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		s = string(bytes.TrimSpace(v))
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("want an int32: %s", v)
	}
	return int32(n), nil
}

// authPolicy reads Istio's AuthenticationPolicy enum as protojson writes it: its
// name or its number. INHERIT (1000) means the mesh's, which is unset here.
func authPolicy(v json.RawMessage) (string, error) {
	var name string
	if err := json.Unmarshal(v, &name); err != nil {
		n, nerr := int32Value(v)
		if nerr != nil {
			return "", fmt.Errorf("want NONE, MUTUAL_TLS or INHERIT: %s", v)
		}
		name = map[int32]string{0: "NONE", 1: "MUTUAL_TLS", 1000: "INHERIT"}[n]
	}
	switch name {
	case "NONE", "MUTUAL_TLS":
		return name, nil
	case "INHERIT":
		return "", nil
	}
	return "", fmt.Errorf("want NONE, MUTUAL_TLS or INHERIT: %s", v)
}

func port(v json.RawMessage) (*int32, error) {
	n, err := int32Value(v)
	if err == nil && (n < 0 || n > 65535) {
		err = fmt.Errorf("port %d out of range", n)
	}
	return &n, err
}

// duration reads a google.protobuf.Duration as protojson writes it: "<seconds>s".
func duration(v json.RawMessage) (*time.Duration, error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return nil, fmt.Errorf("want a duration string such as \"5s\": %s", v)
	}
	num, ok := strings.CutSuffix(s, "s")
	if !ok || num == "" || strings.ContainsAny(num, "smhun") {
		return nil, fmt.Errorf("want seconds such as \"5s\" or \"0.5s\", got %q", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	if d < 0 {
		return nil, fmt.Errorf("%q is negative", s)
	}
	return &d, nil
}

// Load reads PROXY_CONFIG through getenv and returns it with a getenv that falls
// back to its proxyMetadata for a variable the environment leaves empty (as
// Istio's agent applies proxyMetadata under the container's own env). A bad
// PROXY_CONFIG is an error naming it; getenv is then returned unchanged.
func Load(getenv func(string) string) (ProxyConfig, func(string) string, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	pc, err := Parse(getenv(Env))
	if err != nil {
		return ProxyConfig{}, getenv, fmt.Errorf("env %s: %w", Env, err)
	}
	if len(pc.ProxyMetadata) == 0 {
		return pc, getenv, nil
	}
	md := pc.ProxyMetadata
	return pc, func(k string) string {
		if k == flagenv.NamesVar { // the environment's names and proxyMetadata's
			names := []string{getenv(k)}
			for n := range md {
				names = append(names, n)
			}
			return strings.Join(names, "\x00")
		}
		if v := getenv(k); v != "" {
			return v
		}
		return md[k]
	}, nil
}
