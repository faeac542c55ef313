package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/invopop/jsonschema"
	"github.com/nats-io/nats.go"
	sjs "github.com/santhosh-tekuri/jsonschema/v6"
)

var update = flag.Bool("update", false, "rewrite schemas/ and testdata/golden/ from the Go types and samples")

const pemCert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// samples holds one valid payload per registered type; the golden files are these,
// encoded, and every schema must accept them.
var samples = []Payload{
	CertIssued{Serial: "1f2e", SPIFFEID: "spiffe://cluster.local/ns/default/sa/web", NotBefore: t0, NotAfter: t0.Add(24 * time.Hour),
		Pod: web0, Resource: "default", KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-a", Transport: "nats", RootFingerprint: "ab12"},
	TrustChanged{TrustDomain: "cluster.local", Roots: []string{pemCert, pemCert}, Added: []string{"ab12"}, Reason: TrustReasonRotation, Generation: 2},
	SignRequest{CSR: "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n", Token: "eyJ.x.y", TTL: time.Hour, Pod: web0, Resource: "default", KeyAlgorithm: "EC-P256"},
	SignReply{CertChain: []string{pemCert, pemCert}, Roots: []string{pemCert}},
	BundleRequest{},
	BundleReply{TrustDomain: "cluster.local", Roots: []string{pemCert}, Generation: 1},
	RotateRequest{NewKey: true, Reason: "operator"},
	RotateReply{Fingerprint: "ab12", Roots: []string{pemCert, pemCert}},
	RenewDue{Pod: web0, Resource: "default", Serial: "1f2e", NotAfter: t0.Add(24 * time.Hour), Reason: RenewScheduled},
	SecretPushed{Pod: web0, Resource: "default", Serial: "1f2e", Version: "3", Streams: 2, Kind: "pushed"},
	SDSNack{Pod: web0, Node: "sidecar~10.0.0.1~web-0.default~default.svc.cluster.local", Resource: "default", Version: "3", Nonce: "7", Error: "bad key"},
	PodUp{Pod: web0, SPIFFEID: "spiffe://cluster.local/ns/default/sa/web", Mode: "ca", Socket: "/var/run/secrets/workload-spiffe-uds/socket"},
	PodDown{Pod: web0, Reason: "shutdown"},
	XDSConnected{Pod: web0, Stream: "1", Mode: "sotw", Node: "sidecar~web-0", Upstream: "istiod:15012"},
	XDSDisconnected{Pod: web0, Stream: "1", Reason: "upstream closed"},
	XDSNack{Pod: web0, Stream: "1", TypeURL: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "4", ErrorDetail: "bad cluster"},
	XDSAcked{Pod: web0, Stream: "1", TypeURL: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Version: "7", Nonce: "5"},
	TrustAnchors{Pod: web0, Roots: []string{pemCert}},
	EnvoyStarted{Pod: web0, PID: 42, Version: "envoy  version: 1.36.0/Clean/RELEASE/BoringSSL", Binary: "/usr/local/bin/envoy",
		Args: []string{"-c", "/etc/istio/proxy/envoy-rev.json", "--drain-time-s", "45"}},
	EnvoyReady{Pod: web0, PID: 42, StartupMillis: 850},
	EnvoyDraining{Pod: web0, PID: 42, Strategy: DrainZeroConnections, DeadlineMillis: 60000, Reason: "SIGTERM"},
	EnvoyExited{Pod: web0, PID: 42, Code: 0, Drain: DrainZeroReached, ActiveConnections: 0, DrainMillis: 5200},
	PodParts{Pod: web0, Missing: []string{"sds-edge socket /var/run/secrets/workload-spiffe-uds/socket (connection refused)"}},
	TrustFederated{TrustDomain: "cluster.local", Foreign: "west.example", Roots: []string{pemCert}, Version: 1763892000000000000,
		Source: "https://west.example/bundle", Sequence: 3, RefreshHint: 5 * time.Minute, FetchedAt: t0},
	CertExpiring{Pod: web0, Resource: "default", Serial: "1f2e", NotAfter: t0.Add(time.Hour), State: CertStateExpired,
		Failures: 7, LastError: "sign request: nats: no responders available for request"},
	SignerPing{},
	SignerPong{Replica: "signer-1"},
}

func fileName(typ string) string { return strings.TrimPrefix(typ, "io.meshagent.") + ".json" }

func TestEverySampleTypeRegisteredOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range samples {
		if seen[s.EventType()] {
			t.Fatalf("two samples of %s", s.EventType())
		}
		seen[s.EventType()] = true
	}
	known := KnownTypes()
	sort.Strings(known)
	if len(known) != len(seen) {
		t.Fatalf("registry has %d types, samples cover %d", len(known), len(seen))
	}
	for _, k := range known {
		if !seen[k] {
			t.Errorf("no sample (and so no golden file or schema check) for %s", k)
		}
	}
}

func TestGoldenRoundTrip(t *testing.T) {
	for _, s := range samples {
		t.Run(s.EventType(), func(t *testing.T) {
			path := filepath.Join("testdata", "golden", fileName(s.EventType()))
			body, err := json.MarshalIndent(s, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(path, append(body, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			golden, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run go test -update): %v", err)
			}
			if !bytes.Equal(bytes.TrimSpace(golden), body) {
				t.Fatalf("encoding of %s changed: a wire change needs a new version.\ngot:\n%s\ngolden:\n%s", s.EventType(), body, golden)
			}
			// Decode the golden body through a real envelope and compare.
			msg, err := Encode("x", Meta{Source: "test", ID: "id1", Time: t0}, s)
			if err != nil {
				t.Fatal(err)
			}
			msg.Data = golden
			p, meta, err := DecodeAny(msg)
			if err != nil {
				t.Fatal(err)
			}
			if meta.Type != s.EventType() || meta.ID != "id1" || meta.Source != "test" || !meta.Time.Equal(t0) {
				t.Fatalf("meta = %+v", meta)
			}
			again, _ := json.MarshalIndent(p, "", "  ")
			if !bytes.Equal(again, body) {
				t.Fatalf("round trip changed payload:\n%s\n%s", again, body)
			}
		})
	}
}

func TestSchemasMatchTypesAndAcceptGoldens(t *testing.T) {
	r := jsonschema.Reflector{DoNotReference: true, ExpandedStruct: true, AllowAdditionalProperties: true,
		// A PodRef travels as one string (its MarshalText).
		Mapper: func(t reflect.Type) *jsonschema.Schema {
			if t == reflect.TypeFor[PodRef]() {
				return &jsonschema.Schema{Type: "string"}
			}
			return nil
		}}
	for _, s := range samples {
		t.Run(s.EventType(), func(t *testing.T) {
			path := filepath.Join("schemas", fileName(s.EventType()))
			sc := r.Reflect(s)
			sc.ID = jsonschema.ID("https://meshagent.dev/schemas/" + fileName(s.EventType()))
			sc.Title = s.EventType()
			want, err := json.MarshalIndent(sc, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(path, append(want, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read schema (run go test -update): %v", err)
			}
			if !bytes.Equal(bytes.TrimSpace(got), want) {
				t.Fatalf("schemas/%s is out of date with the Go type: run go test -update", fileName(s.EventType()))
			}
			doc, err := sjs.UnmarshalJSON(bytes.NewReader(got))
			if err != nil {
				t.Fatal(err)
			}
			c := sjs.NewCompiler()
			if err := c.AddResource(path, doc); err != nil {
				t.Fatal(err)
			}
			compiled, err := c.Compile(path)
			if err != nil {
				t.Fatal(err)
			}
			golden, err := os.ReadFile(filepath.Join("testdata", "golden", fileName(s.EventType())))
			if err != nil {
				t.Fatal(err)
			}
			inst, err := sjs.UnmarshalJSON(bytes.NewReader(golden))
			if err != nil {
				t.Fatal(err)
			}
			if err := compiled.Validate(inst); err != nil {
				t.Fatalf("golden does not validate against its schema: %v", err)
			}
		})
	}
}

func mustMsg(t *testing.T, p Payload) *nats.Msg {
	t.Helper()
	m, err := NewMsg("meshagent.evt.test", "test", p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDecodeRejects(t *testing.T) {
	good := samples[0].(CertIssued)
	tests := []struct {
		name string
		msg  func() *nats.Msg
		want error
	}{
		{"oversize", func() *nats.Msg { m := mustMsg(t, good); m.Data = bytes.Repeat([]byte(" "), MaxEventSize+1); return m }, ErrTooLarge},
		{"no headers", func() *nats.Msg { return &nats.Msg{Data: []byte(`{}`)} }, ErrNotEvent},
		{"wrong specversion", func() *nats.Msg { m := mustMsg(t, good); m.Header.Set(HeaderSpecVersion, "0.3"); return m }, ErrNotEvent},
		{"missing id", func() *nats.Msg { m := mustMsg(t, good); m.Header.Del(HeaderID); return m }, ErrNotEvent},
		{"bad time", func() *nats.Msg { m := mustMsg(t, good); m.Header.Set(HeaderTime, "yesterday"); return m }, ErrNotEvent},
		{"bad content type", func() *nats.Msg { m := mustMsg(t, good); m.Header.Set(HeaderContentType, "text/xml"); return m }, ErrNotEvent},
		{"unknown type", func() *nats.Msg {
			m := mustMsg(t, good)
			m.Header.Set(HeaderType, "io.meshagent.cert.issued.v9")
			return m
		}, ErrUnknownType},
		{"wrong type", func() *nats.Msg { return mustMsg(t, PodDown{Pod: podP}) }, ErrWrongType},
		{"garbled body", func() *nats.Msg { m := mustMsg(t, good); m.Data = []byte("\x00\x01garbage"); return m }, ErrInvalid},
		{"array body", func() *nats.Msg { m := mustMsg(t, good); m.Data = []byte(`[1,2]`); return m }, ErrInvalid},
		{"trailing data", func() *nats.Msg { m := mustMsg(t, good); m.Data = append(m.Data, []byte(`{}`)...); return m }, ErrInvalid},
		{"wrong field type", func() *nats.Msg { m := mustMsg(t, good); m.Data = []byte(`{"serial":5}`); return m }, ErrInvalid},
		{"missing required", func() *nats.Msg { m := mustMsg(t, good); m.Data = []byte(`{"serial":"ab"}`); return m }, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Decode[CertIssued](tt.msg())
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeIgnoresUnknownFields(t *testing.T) {
	m := mustMsg(t, samples[0])
	var obj map[string]any
	if err := json.Unmarshal(m.Data, &obj); err != nil {
		t.Fatal(err)
	}
	obj["added_in_a_later_minor"] = "ok"
	m.Data, _ = json.Marshal(obj)
	got, _, err := Decode[CertIssued](m)
	if err != nil {
		t.Fatalf("unknown field rejected: %v", err)
	}
	if got.Serial != "1f2e" {
		t.Fatalf("serial = %q", got.Serial)
	}
}

func TestEncodeRefusesInvalidAndOversize(t *testing.T) {
	if _, err := NewMsg("s", "src", CertIssued{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid payload encoded: %v", err)
	}
	big := TrustAnchors{Pod: podP, Roots: []string{pemCert + strings.Repeat("A", MaxEventSize)}}
	if _, err := NewMsg("s", "src", big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize payload encoded: %v", err)
	}
	if _, err := NewMsg("s", "", PodDown{Pod: podP}); err == nil {
		t.Fatal("empty source accepted")
	}
}

func TestValidationReportsEveryProblem(t *testing.T) {
	err := CertIssued{}.Validate()
	for _, f := range []string{"serial", "spiffe_id", "not_before", "key_algorithm", "signer", "root_fingerprint"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error %v does not name %s", err, f)
		}
	}
}

func TestPodSubjects(t *testing.T) {
	tests := []struct {
		ns, name, want string
		ok             bool
	}{
		{"default", "web-0", "meshagent.pod.default.web-0.renew", true},
		{"shop", "web-0.default", "meshagent.pod.shop.web-0~default.renew", true},
		{"default", "", "", false},
		{"", "web-0", "", false},
		{"default", "a b", "", false},
		{"default", "a.*", "", false},
		{"default", "a>", "", false},
		{"default", "-a", "", false},
		{"default", "a-", "", false},
		{"default", "a", "meshagent.pod.default.a.renew", true},
		{"default", "a~b", "", false},
		{"default", "a/b", "", false},
		{"Default", "a", "", false},
		{"de.fault", "a", "", false},
		{"de_fault", "a", "", false},
		{"*", "a", "", false},
		{"-ns", "a", "", false},
		{strings.Repeat("n", 63), "a", "meshagent.pod." + strings.Repeat("n", 63) + ".a.renew", true},
		{strings.Repeat("n", 64), "a", "", false},
		{"default", strings.Repeat("a", 253), "meshagent.pod.default." + strings.Repeat("a", 253) + ".renew", true},
		{"default", strings.Repeat("a", 254), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.ns+"/"+tt.name, func(t *testing.T) {
			got, err := PodRenewSubject(PodRef{Namespace: tt.ns, Name: tt.name})
			if (err == nil) != tt.ok || got != tt.want {
				t.Fatalf("PodRenewSubject(%s/%s) = %q, %v", tt.ns, tt.name, got, err)
			}
		})
	}
}

func TestResourceNamesAreBounded(t *testing.T) {
	long := strings.Repeat("a", 3000)
	bad := []Payload{
		CertIssued{Serial: "1", SPIFFEID: "spiffe://td/ns/a/sa/b", NotBefore: t0, NotAfter: t0.Add(time.Hour), KeyAlgorithm: "EC-P256",
			AuthSource: "jwt", Signer: "s", RootFingerprint: "ab", Resource: long},
		SignRequest{CSR: "-----BEGIN CERTIFICATE REQUEST-----", Token: "t", Resource: long},
		SignRequest{CSR: "-----BEGIN CERTIFICATE REQUEST-----", Token: "t", Resource: "default\n"},
		RenewDue{Pod: podP, Reason: RenewForced, Resource: "a b"},
	}
	for _, p := range bad {
		t.Run(p.EventType(), func(t *testing.T) {
			err := p.Validate()
			if err == nil || !strings.Contains(err.Error(), "resource") {
				t.Fatalf("resource not rejected: %v", err)
			}
		})
	}
	ok := RenewDue{Pod: podP, Reason: RenewForced, Resource: "default"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}

var (
	web0 = PodRef{Namespace: "default", Name: "web-0"}
	podP = PodRef{Namespace: "shop", Name: "p"}
)
