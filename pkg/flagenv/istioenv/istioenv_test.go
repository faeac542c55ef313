package istioenv

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

// sample is a ProxyConfig as an Istio mesh sets one, with every field we read.
func sample() *meshconfig.ProxyConfig {
	return &meshconfig.ProxyConfig{
		DiscoveryAddress:                "istiod.istio-system.svc:15012",
		StatusPort:                      15020,
		ProxyAdminPort:                  15000,
		DrainDuration:                   durationpb.New(45 * time.Second),
		TerminationDrainDuration:        durationpb.New(1500 * time.Millisecond),
		BinaryPath:                      "/usr/local/bin/envoy",
		Concurrency:                     wrapperspb.Int32(2),
		ProxyMetadata:                   map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "ECC_SIGNATURE_ALGORITHM": "ECDSA"},
		HoldApplicationUntilProxyStarts: wrapperspb.Bool(true),
		InterceptionMode:                meshconfig.ProxyConfig_REDIRECT,
		Tracing:                         &meshconfig.Tracing{Tracer: &meshconfig.Tracing_Zipkin_{Zipkin: &meshconfig.Tracing_Zipkin{Address: "zipkin:9411"}}},
		ClusterName:                     &meshconfig.ProxyConfig_ServiceCluster{ServiceCluster: "istio-proxy"},
		ReadinessProbe: &networking.ReadinessProbe{InitialDelaySeconds: 1, PeriodSeconds: 2, SuccessThreshold: 1, FailureThreshold: 3,
			HealthCheckMethod: &networking.ReadinessProbe_HttpGet{HttpGet: &networking.HTTPHealthCheckConfig{Path: "/ready", Port: 8080,
				HttpHeaders: []*networking.HTTPHeader{{Name: "X-Probe", Value: "yes"}}}}},
	}
}

// TestParseAgreesWithIstioTypes: what istio.io/api's protojson writes (lowerCamel
// names, and the proto names), Parse reads to the same values.
func TestParseAgreesWithIstioTypes(t *testing.T) {
	want := sample()
	for _, opt := range []protojson.MarshalOptions{{}, {UseProtoNames: true}, {Multiline: true, Indent: "  "}} {
		b, err := opt.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Parse(string(b))
		if err != nil {
			t.Fatalf("Parse(%s): %v", b, err)
		}
		check(t, want, got)
	}
}

func check(t *testing.T, want *meshconfig.ProxyConfig, got ProxyConfig) {
	t.Helper()
	if got.DiscoveryAddress != want.GetDiscoveryAddress() || got.BinaryPath != want.GetBinaryPath() {
		t.Errorf("strings: %+v, want %v", got, want)
	}
	if got.StatusPort == nil || *got.StatusPort != want.GetStatusPort() || got.ProxyAdminPort == nil || *got.ProxyAdminPort != want.GetProxyAdminPort() {
		t.Errorf("ports: %v %v, want %d %d", got.StatusPort, got.ProxyAdminPort, want.GetStatusPort(), want.GetProxyAdminPort())
	}
	if got.DrainDuration == nil || *got.DrainDuration != want.GetDrainDuration().AsDuration() {
		t.Errorf("drainDuration %v, want %v", got.DrainDuration, want.GetDrainDuration().AsDuration())
	}
	if got.TerminationDrainDuration == nil || *got.TerminationDrainDuration != want.GetTerminationDrainDuration().AsDuration() {
		t.Errorf("terminationDrainDuration %v, want %v", got.TerminationDrainDuration, want.GetTerminationDrainDuration().AsDuration())
	}
	if got.Concurrency == nil || *got.Concurrency != want.GetConcurrency().GetValue() {
		t.Errorf("concurrency %v, want %v", got.Concurrency, want.GetConcurrency())
	}
	if !maps.Equal(got.ProxyMetadata, want.GetProxyMetadata()) {
		t.Errorf("proxyMetadata %v, want %v", got.ProxyMetadata, want.GetProxyMetadata())
	}
	if p := asIstio(got.ReadinessProbe); !proto.Equal(p, want.GetReadinessProbe()) {
		t.Errorf("readinessProbe %v, want %v", p, want.GetReadinessProbe())
	}
}

// TestEveryIstioFieldIsUsedOrIgnored: each of ProxyConfig's fields is read or
// listed as ignored (with a reason), and no name is listed that ProxyConfig lacks:
// an Istio upgrade that adds a field fails here until it is placed.
func TestEveryIstioFieldIsUsedOrIgnored(t *testing.T) {
	fields := (&meshconfig.ProxyConfig{}).ProtoReflect().Descriptor().Fields()
	istio := map[string]bool{}
	for i := range fields.Len() {
		istio[fields.Get(i).JSONName()] = true
	}
	ours := map[string]bool{}
	for _, n := range Used {
		ours[n] = true
	}
	for n, why := range Ignored {
		if ours[n] {
			t.Errorf("%s is both used and ignored", n)
		}
		if strings.TrimSpace(why) == "" {
			t.Errorf("%s: ignored without a reason", n)
		}
		ours[n] = true
	}
	for n := range istio {
		if !ours[n] {
			t.Errorf("Istio's ProxyConfig field %s is neither used nor listed as ignored", n)
		}
	}
	for n := range ours {
		if !istio[n] {
			t.Errorf("%s is not a field of Istio's ProxyConfig", n)
		}
	}
}

func TestParseRefusesBadInput(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", `{"discoveryAddress":"x:1","discoveryAdress":"y:2"}`, "unknown field(s) discoveryAdress"},
		{"not a mapping", "discoveryAddress x:1", "want a JSON object or a YAML mapping"},
		{"yaml list", "- discoveryAddress: x:1", "want a JSON object or a YAML mapping"},
		{"bad yaml", "discoveryAddress: [x:1", "want a JSON object or a YAML mapping"},
		{"unknown yaml field", "discoveryAdress: x:1", "unknown field(s) discoveryAdress"},
		{"yaml duration without unit", "drainDuration: 45", "drainDuration: want"},
		{"duration without unit", `{"drainDuration":"45"}`, "drainDuration: want seconds"},
		{"duration in minutes", `{"terminationDrainDuration":"1m"}`, "terminationDrainDuration: want seconds"},
		{"negative duration", `{"drainDuration":"-1s"}`, "negative"},
		{"port out of range", `{"statusPort":70000}`, "statusPort: port 70000 out of range"},
		{"concurrency not a number", `{"concurrency":"two"}`, "concurrency: want an int32"},
		{"negative concurrency", `{"concurrency":-1}`, "concurrency: -1 is negative"},
		{"metadata not strings", `{"proxyMetadata":{"A":1}}`, "proxyMetadata"},
		{"given twice", `{"statusPort":1,"status_port":2}`, "statusPort: given twice"},
		{"trailing data", `{} {}`, "trailing data"},
		{"too big", `{"binaryPath":"` + strings.Repeat("a", MaxSize) + `"}`, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := Parse(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want an error containing %q", err, tc.want)
			}
			if pc.DiscoveryAddress != "" || pc.StatusPort != nil || pc.Set != nil {
				t.Fatalf("a refused config still set fields: %+v", pc)
			}
		})
	}
}

// TestParseReadsYAMLAsIstioDoes: PROXY_CONFIG as YAML (the form Istio's docs
// write it in a proxy.istio.io/config annotation) reads to what Istio's agent
// reads from it: sigs.k8s.io/yaml to JSON, then protojson (protomarshal.ApplyYAML).
func TestParseReadsYAMLAsIstioDoes(t *testing.T) {
	j, err := protojson.Marshal(sample())
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		t.Fatal(err)
	}
	handWritten := `discoveryAddress: istiod.istio-system.svc:15012
readinessProbe:
  initialDelaySeconds: 1
  periodSeconds: 2
  successThreshold: 1
  failureThreshold: 3
  httpGet: {path: /ready, port: 8080, httpHeaders: [{name: X-Probe, value: "yes"}]}
statusPort: 15020
proxyAdminPort: 15000
drainDuration: 45s
terminationDrainDuration: 1.5s
binaryPath: /usr/local/bin/envoy
concurrency: 2
holdApplicationUntilProxyStarts: true
proxyMetadata:
  ISTIO_META_DNS_CAPTURE: "true"
  ECC_SIGNATURE_ALGORITHM: ECDSA
`
	flow := `{discoveryAddress: "istiod.istio-system.svc:15012", readinessProbe: {initialDelaySeconds: 1, periodSeconds: 2,
 successThreshold: 1, failureThreshold: 3, httpGet: {path: /ready, port: 8080, httpHeaders: [{name: X-Probe, value: "yes"}]}}, statusPort: 15020, proxyAdminPort: 15000, drainDuration: 45s,
 terminationDrainDuration: 1.5s, binaryPath: /usr/local/bin/envoy, concurrency: 2,
 proxyMetadata: {ISTIO_META_DNS_CAPTURE: "true", ECC_SIGNATURE_ALGORITHM: ECDSA}}`
	for name, in := range map[string]string{"from protojson": string(y), "hand-written": handWritten, "flow": flow} {
		t.Run(name, func(t *testing.T) {
			// What Istio's agent makes of it.
			rj, err := yaml.YAMLToJSON([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			var ref meshconfig.ProxyConfig
			if err := protojson.Unmarshal(rj, &ref); err != nil {
				t.Fatalf("Istio refuses %s: %v", in, err)
			}
			got, err := Parse(in)
			if err != nil {
				t.Fatalf("Parse(%s): %v", in, err)
			}
			check(t, &ref, got)
			check(t, sample(), got)
		})
	}
}

func TestParseAcceptsWhatIstioAccepts(t *testing.T) {
	// protojson takes int32 as strings, and null as unset.
	in := `{"statusPort":"15021","concurrency":"0","binaryPath":null,"drainDuration":"0.5s"}`
	var ref meshconfig.ProxyConfig
	if err := protojson.Unmarshal([]byte(in), &ref); err != nil {
		t.Fatal(err)
	}
	got, err := Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	if *got.StatusPort != ref.GetStatusPort() || *got.Concurrency != ref.GetConcurrency().GetValue() || got.BinaryPath != "" ||
		*got.DrainDuration != ref.GetDrainDuration().AsDuration() {
		t.Fatalf("got %+v, Istio %v", got, &ref)
	}
}

// TestControlPlaneAuthPolicyAsIstioReadsIt: the enum by name or number, as
// protojson takes it; INHERIT is unset; anything else is refused as Istio refuses it.
func TestControlPlaneAuthPolicyAsIstioReadsIt(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`"NONE"`, "NONE"}, {`0`, "NONE"}, {`"MUTUAL_TLS"`, "MUTUAL_TLS"}, {`1`, "MUTUAL_TLS"}, {`"INHERIT"`, ""}, {`1000`, ""},
	} {
		in := `{"controlPlaneAuthPolicy":` + tc.in + `}`
		var ref meshconfig.ProxyConfig
		if err := protojson.Unmarshal([]byte(in), &ref); err != nil {
			t.Fatalf("istio refuses %s: %v", in, err)
		}
		got, err := Parse(in)
		if err != nil || got.ControlPlaneAuthPolicy != tc.want {
			t.Errorf("Parse(%s) = %q, %v; want %q (Istio: %v)", in, got.ControlPlaneAuthPolicy, err, tc.want, ref.GetControlPlaneAuthPolicy())
		}
		if tc.want != "" && ref.GetControlPlaneAuthPolicy().String() != tc.want {
			t.Errorf("Istio reads %s as %v", in, ref.GetControlPlaneAuthPolicy())
		}
	}
	in := `{"controlPlaneAuthPolicy":"TLS"}`
	if err := protojson.Unmarshal([]byte(in), &meshconfig.ProxyConfig{}); err == nil {
		t.Fatal("istio takes TLS")
	}
	if _, err := Parse(in); err == nil {
		t.Fatal("Parse takes TLS")
	}
}

func TestLoadFallsBackToProxyMetadata(t *testing.T) {
	env := map[string]string{
		Env:         `{"proxyMetadata":{"ECC_SIGNATURE_ALGORITHM":"ECDSA","ECC_CURVE":"P384"}}`,
		"ECC_CURVE": "P256", // the container's own env wins, as in Istio
	}
	pc, getenv, err := Load(flagenv.Map(env))
	if err != nil {
		t.Fatal(err)
	}
	if getenv("ECC_SIGNATURE_ALGORITHM") != "ECDSA" || getenv("ECC_CURVE") != "P256" || getenv("OTHER") != "" {
		t.Fatalf("getenv: %q %q %q", getenv("ECC_SIGNATURE_ALGORITHM"), getenv("ECC_CURVE"), getenv("OTHER"))
	}
	// The names it lists are the environment's and proxyMetadata's (as Istio's
	// agent turns proxyMetadata's ISTIO_META_* into node metadata too).
	if got := flagenv.Names(getenv, "ECC_"); !slices.Equal(got, []string{"ECC_CURVE", "ECC_SIGNATURE_ALGORITHM"}) {
		t.Fatalf("listed names %q", got)
	}
	if len(pc.ProxyMetadata) != 2 {
		t.Fatalf("metadata %v", pc.ProxyMetadata)
	}
	env[Env] = `{"nope":1}`
	if _, _, err := Load(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "env PROXY_CONFIG") {
		t.Fatalf("bad PROXY_CONFIG: %v", err)
	}
}

// FuzzParse: Parse never panics, and whatever it and istio.io/api both accept
// they read the same.
func FuzzParse(f *testing.F) {
	b, _ := protojson.Marshal(sample())
	f.Add(string(b))
	f.Add(`{"statusPort":"15021","concurrency":0}`)
	f.Add(`{"drainDuration":"1.000000001s"}`)
	f.Fuzz(func(t *testing.T, in string) {
		got, err := Parse(in)
		var ref meshconfig.ProxyConfig
		if err != nil || protojson.Unmarshal([]byte(in), &ref) != nil {
			return
		}
		if got.DiscoveryAddress != ref.GetDiscoveryAddress() || got.BinaryPath != ref.GetBinaryPath() {
			t.Fatalf("strings differ: %+v vs %v", got, &ref)
		}
		if got.StatusPort != nil && *got.StatusPort != ref.GetStatusPort() {
			t.Fatalf("statusPort %d vs %d", *got.StatusPort, ref.GetStatusPort())
		}
		if got.DrainDuration != nil && *got.DrainDuration != ref.GetDrainDuration().AsDuration() {
			t.Fatalf("drainDuration %v vs %v", *got.DrainDuration, ref.GetDrainDuration().AsDuration())
		}
		if got.Concurrency != nil && *got.Concurrency != ref.GetConcurrency().GetValue() {
			t.Fatalf("concurrency %d vs %d", *got.Concurrency, ref.GetConcurrency().GetValue())
		}
		if len(got.ProxyMetadata) > 0 && !maps.Equal(got.ProxyMetadata, ref.GetProxyMetadata()) {
			t.Fatalf("metadata %v vs %v", got.ProxyMetadata, ref.GetProxyMetadata())
		}
	})
}

// JSON is the whole ProxyConfig as an object Istio's own type reads back to
// the same config, from JSON or YAML; nil when PROXY_CONFIG is unset.
func TestJSONIsTheWholeProxyConfig(t *testing.T) {
	j, err := protojson.Marshal(sample())
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string]string{"json": string(j), "yaml": string(y)} {
		pc, err := Parse(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var back meshconfig.ProxyConfig
		if err := protojson.Unmarshal(pc.JSON, &back); err != nil || !proto.Equal(&back, sample()) {
			t.Fatalf("%s: JSON %s reads back as %v (%v), want %v", name, pc.JSON, &back, err, sample())
		}
	}
	if pc, err := Parse(""); err != nil || pc.JSON != nil {
		t.Fatalf("unset: %s (%v), want nil", pc.JSON, err)
	}
}

// asIstio is p as istio.io/api's type, to compare with what protojson reads.
func asIstio(p *ReadinessProbe) *networking.ReadinessProbe {
	if p == nil {
		return nil
	}
	out := &networking.ReadinessProbe{InitialDelaySeconds: p.InitialDelaySeconds, TimeoutSeconds: p.TimeoutSeconds,
		PeriodSeconds: p.PeriodSeconds, SuccessThreshold: p.SuccessThreshold, FailureThreshold: p.FailureThreshold}
	switch {
	case p.HTTPGet != nil:
		g := &networking.HTTPHealthCheckConfig{Path: p.HTTPGet.Path, Port: p.HTTPGet.Port, Host: p.HTTPGet.Host, Scheme: p.HTTPGet.Scheme}
		for _, h := range p.HTTPGet.Headers {
			g.HttpHeaders = append(g.HttpHeaders, &networking.HTTPHeader{Name: h.Name, Value: h.Value})
		}
		out.HealthCheckMethod = &networking.ReadinessProbe_HttpGet{HttpGet: g}
	case p.TCPSocket != nil:
		out.HealthCheckMethod = &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{Host: p.TCPSocket.Host, Port: p.TCPSocket.Port}}
	case p.Exec != nil:
		out.HealthCheckMethod = &networking.ReadinessProbe_Exec{Exec: &networking.ExecHealthCheckConfig{Command: p.Exec.Command}}
	case p.GRPC != nil:
		out.HealthCheckMethod = &networking.ReadinessProbe_Grpc{Grpc: &networking.GrpcHealthCheckConfig{Port: p.GRPC.Port, Service: p.GRPC.Service}}
	}
	return out
}

// TestReadinessProbeAsIstioReadsIt: each of the four methods, by lowerCamel or
// proto names, reads to what istio.io/api's protojson reads; what Istio refuses
// (two methods, a field the message lacks) is refused, and so are probes Istio's
// agent cannot run (no method, no port, no command).
func TestReadinessProbeAsIstioReadsIt(t *testing.T) {
	for _, in := range []string{
		`{"httpGet":{"path":"/ready","port":8080,"host":"127.0.0.1","scheme":"HTTPS","httpHeaders":[{"name":"Host","value":"web"}]},"timeoutSeconds":2}`,
		`{"http_get":{"port":"8080"},"initial_delay_seconds":"5","period_seconds":1,"success_threshold":2,"failure_threshold":4}`,
		`{"tcpSocket":{"port":9000}}`,
		`{"tcp_socket":{"host":"localhost","port":9000},"timeoutSeconds":null}`,
		`{"exec":{"command":["/bin/true","-x"]}}`,
		`{"grpc":{"port":9090,"service":"web"}}`,
	} {
		var ref networking.ReadinessProbe
		if err := protojson.Unmarshal([]byte(in), &ref); err != nil {
			t.Fatalf("Istio refuses %s: %v", in, err)
		}
		pc, err := Parse(`{"readinessProbe":` + in + `}`)
		if err != nil {
			t.Fatalf("Parse(%s): %v", in, err)
		}
		if got := asIstio(pc.ReadinessProbe); !proto.Equal(got, &ref) {
			t.Errorf("%s: read %v, Istio %v", in, got, &ref)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`{"httpGet":{"port":1},"tcpSocket":{"port":2}}`, "more than one of httpGet, tcpSocket"},
		{`{"httpGet":{"port":1,"paht":"/"}}`, "paht: not a field"},
		{`{"periodSeconds":1,"perodSeconds":2,"tcpSocket":{"port":2}}`, "perodSeconds: not a field"},
	} {
		if err := protojson.Unmarshal([]byte(tc.in), &networking.ReadinessProbe{}); err == nil {
			t.Errorf("Istio takes %s", tc.in)
		}
		if _, err := Parse(`{"readinessProbe":` + tc.in + `}`); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s): %v, want %q", tc.in, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`{"periodSeconds":1}`, "want one of httpGet, tcpSocket, exec, grpc"},
		{`{"httpGet":{"path":"/"}}`, "httpGet: port: required"},
		{`{"exec":{"command":[]}}`, "exec: command: required"},
		{`{"tcpSocket":{"port":70000}}`, "out of range"},
		{`{"failureThreshold":-1,"tcpSocket":{"port":1}}`, "failureThreshold: -1 is negative"},
		{`{"httpGet":{"port":1,"scheme":"ftp"}}`, "want HTTP or HTTPS"},
	} {
		if _, err := Parse(`{"readinessProbe":` + tc.in + `}`); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s): %v, want %q", tc.in, err, tc.want)
		}
	}
}
