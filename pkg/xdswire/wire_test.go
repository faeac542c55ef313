package xdswire

import (
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The generated types are the reference: what this package writes must decode
// with them to exactly the message meant, and what they write (with every field
// this package skips set too) must decode here to the same values.

func TestEncodedMessagesDecodeWithTheGeneratedTypes(t *testing.T) {
	anyA := &anypb.Any{TypeUrl: "type.googleapis.com/x.A", Value: []byte{1, 2, 3}}
	for _, tc := range []struct {
		name string
		ours Message
		want proto.Message
	}{
		{"request", &DiscoveryRequest{VersionInfo: "7", NodeID: "sidecar~1", ResourceNames: []string{"default", "", "ROOTCA"},
			TypeURL: SecretTypeURL, ResponseNonce: "n1", ErrorDetail: &Status{Code: 3, Message: "bad"}},
			&discoveryv3.DiscoveryRequest{VersionInfo: "7", Node: &corev3.Node{Id: "sidecar~1"}, ResourceNames: []string{"default", "", "ROOTCA"},
				TypeUrl: SecretTypeURL, ResponseNonce: "n1", ErrorDetail: &statuspb.Status{Code: 3, Message: "bad"}}},
		{"empty request", &DiscoveryRequest{}, &discoveryv3.DiscoveryRequest{}},
		{"nack without detail text", &DiscoveryRequest{ErrorDetail: &Status{}}, &discoveryv3.DiscoveryRequest{ErrorDetail: &statuspb.Status{}}},
		{"negative code", &DiscoveryRequest{ErrorDetail: &Status{Code: -2}}, &discoveryv3.DiscoveryRequest{ErrorDetail: &statuspb.Status{Code: -2}}},
		{"response", &DiscoveryResponse{VersionInfo: "3", TypeURL: "t", Nonce: "z", Resources: []Any{{TypeURL: anyA.TypeUrl, Value: anyA.Value}, {}}},
			&discoveryv3.DiscoveryResponse{VersionInfo: "3", TypeUrl: "t", Nonce: "z", Resources: []*anypb.Any{anyA, {}}}},
		{"delta request", &DeltaDiscoveryRequest{NodeID: "n", TypeURL: "t", Subscribe: []string{"a", "b"}, Unsubscribe: []string{"c"},
			InitialResourceVersions: map[string]string{"b": "2", "a": "1", "": ""}, ResponseNonce: "x", ErrorDetail: &Status{Code: 13, Message: "m"}},
			&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: "t", ResourceNamesSubscribe: []string{"a", "b"},
				ResourceNamesUnsubscribe: []string{"c"}, InitialResourceVersions: map[string]string{"b": "2", "a": "1", "": ""},
				ResponseNonce: "x", ErrorDetail: &statuspb.Status{Code: 13, Message: "m"}}},
		{"delta response", &DeltaDiscoveryResponse{SystemVersionInfo: "9", TypeURL: "t", Nonce: "q", RemovedResources: []string{"gone"},
			Resources: []Resource{{Name: "a", Version: "1", Resource: &Any{TypeURL: anyA.TypeUrl, Value: anyA.Value}}, {Name: "b"}}},
			&discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "9", TypeUrl: "t", Nonce: "q", RemovedResources: []string{"gone"},
				Resources: []*discoveryv3.Resource{{Name: "a", Version: "1", Resource: anyA}, {Name: "b"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.want.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(tc.ours.AppendWire(nil), got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Fatalf("decoded as\n%v\nwant\n%v", got, tc.want)
			}
			// ...and back: the generated encoding decodes here to what was encoded.
			b, err := proto.Marshal(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			m := newLike(tc.ours)
			if err := m.UnmarshalWire(b); err != nil {
				t.Fatal(err)
			}
			if string(m.AppendWire(nil)) != string(tc.ours.AppendWire(nil)) {
				t.Fatalf("round trip through the generated encoding changed the message: %+v, want %+v", m, tc.ours)
			}
		})
	}
}

func newLike(m Message) Message {
	switch m.(type) {
	case *DiscoveryRequest:
		return &DiscoveryRequest{}
	case *DiscoveryResponse:
		return &DiscoveryResponse{}
	case *DeltaDiscoveryRequest:
		return &DeltaDiscoveryRequest{}
	case *DeltaDiscoveryResponse:
		return &DeltaDiscoveryResponse{}
	}
	panic(m)
}

// Fields this package does not keep are skipped, whatever they hold; a message
// field given twice merges, and another member of a oneof replaces the last.
func TestGeneratedMessagesWithEveryFieldDecode(t *testing.T) {
	node := &corev3.Node{Id: "sidecar~10.0.0.1~web-0.ns~ns.svc.cluster.local", Cluster: "web", UserAgentName: "envoy",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"LABELS": structpb.NewStringValue("app=web")}},
		Locality: &corev3.Locality{Region: "r"}, ClientFeatures: []string{"envoy.lb.does_not_support_overprovisioning"}}
	req := &discoveryv3.DiscoveryRequest{VersionInfo: "1", Node: node, ResourceNames: []string{"default"}, TypeUrl: SecretTypeURL,
		ResponseNonce: "n", ErrorDetail: &statuspb.Status{Code: 3, Message: "m", Details: []*anypb.Any{{TypeUrl: "d"}}},
		ResourceLocators: []*discoveryv3.ResourceLocator{{Name: "loc"}}}
	b := marshal(t, req)
	// A second node whose id is unset keeps the first id; a second error detail merges.
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, marshal(t, &corev3.Node{Cluster: "other"}))
	b = protowire.AppendTag(b, 6, protowire.BytesType)
	b = protowire.AppendBytes(b, marshal(t, &statuspb.Status{Message: "later"}))
	// Field 4 (type_url) as a varint is not type_url: skipped, as protobuf skips it.
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, 7)
	var got DiscoveryRequest
	if err := got.UnmarshalWire(b); err != nil {
		t.Fatal(err)
	}
	var ref discoveryv3.DiscoveryRequest
	if err := proto.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	if got.NodeID != ref.GetNode().GetId() || got.ErrorDetail.Message != "later" || ref.GetErrorDetail().GetMessage() != "later" ||
		got.ErrorDetail.Code != 3 || got.TypeURL != SecretTypeURL || got.VersionInfo != "1" || got.ResponseNonce != "n" ||
		strings.Join(got.ResourceNames, ",") != "default" {
		t.Fatalf("decoded %+v (detail %+v), generated types decode %v", got, got.ErrorDetail, &ref)
	}

	resp := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "s", TypeUrl: "t", Nonce: "n", RemovedResources: []string{"r"},
		RemovedResourceNames: []*discoveryv3.ResourceName{{Name: "r"}}, ControlPlane: &corev3.ControlPlane{Identifier: "cp"},
		Resources: []*discoveryv3.Resource{{Name: "a", Version: "v", Aliases: []string{"x"}, Ttl: durationpb.New(5),
			Resource: &anypb.Any{TypeUrl: "u", Value: []byte("v")}}}}
	var dr DeltaDiscoveryResponse
	if err := dr.UnmarshalWire(marshal(t, resp)); err != nil {
		t.Fatal(err)
	}
	if dr.SystemVersionInfo != "s" || dr.TypeURL != "t" || dr.Nonce != "n" || strings.Join(dr.RemovedResources, ",") != "r" ||
		len(dr.Resources) != 1 || dr.Resources[0].Name != "a" || dr.Resources[0].Version != "v" ||
		dr.Resources[0].Resource.TypeURL != "u" || string(dr.Resources[0].Resource.Value) != "v" {
		t.Fatalf("delta response decoded as %+v", dr)
	}
}

func TestMalformedMessagesAreErrors(t *testing.T) {
	valid := (&DiscoveryRequest{TypeURL: "t"}).AppendWire(nil)
	for name, b := range map[string][]byte{
		"truncated":           valid[:len(valid)-1],
		"bad tag":             {0x00},
		"length past end":     {0x22, 0x05, 'a'},
		"invalid utf-8":       AppendBytes(nil, 4, []byte{0xff, 0xfe}),
		"bad node":            AppendBytes(nil, 2, []byte{0x0a, 0x09}),
		"bad utf-8 in a nack": AppendBytes(nil, 6, AppendBytes(nil, 2, []byte{0xc3})),
	} {
		var r DiscoveryRequest
		err := r.UnmarshalWire(b)
		if err == nil || !strings.Contains(err.Error(), "decode DiscoveryRequest") {
			t.Errorf("%s: %v", name, err)
		}
		if proto.Unmarshal(b, &discoveryv3.DiscoveryRequest{}) == nil {
			t.Errorf("%s: the generated types accept it", name)
		}
	}
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSecretsAreEnvoysSecrets(t *testing.T) {
	chain, key, ca := []byte("-----BEGIN CERTIFICATE-----\nA\n"), []byte("-----BEGIN PRIVATE KEY-----\nK\n"), []byte("-----BEGIN CERTIFICATE-----\nR\n")
	inline := func(b []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
	}
	spiffeCfg, err := anypb.New(&tlsv3.SPIFFECertValidatorConfig{TrustDomains: []*tlsv3.SPIFFECertValidatorConfig_TrustDomain{
		{Name: "cluster.local", TrustBundle: inline(ca)}, {Name: "west.example", TrustBundle: inline(chain)}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		s    Secret
		want *tlsv3.Secret
	}{
		{"certificate", Secret{Name: "default", CertChain: chain, PrivateKey: key},
			&tlsv3.Secret{Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
				CertificateChain: inline(chain), PrivateKey: inline(key)}}}},
		{"roots", Secret{Name: "ROOTCA", TrustedCA: ca},
			&tlsv3.Secret{Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa: inline(ca)}}}},
		{"spiffe validator", Secret{Name: "ROOTCA_SPIFFE", SPIFFE: []TrustDomain{{"cluster.local", ca}, {"west.example", chain}}},
			&tlsv3.Secret{Name: "ROOTCA_SPIFFE", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: spiffeCfg}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.s.Any()
			var got tlsv3.Secret
			if a.TypeURL != SecretTypeURL {
				t.Fatalf("type %q", a.TypeURL)
			}
			if err := proto.Unmarshal(a.Value, &got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&got, tc.want) {
				t.Fatalf("decoded as %v\nwant %v", &got, tc.want)
			}
			if err := got.ValidateAll(); err != nil {
				t.Fatalf("Envoy's validation: %v", err)
			}
			if tc.s.SPIFFE != nil {
				var cfg tlsv3.SPIFFECertValidatorConfig
				if err := got.GetValidationContext().GetCustomValidatorConfig().GetTypedConfig().UnmarshalTo(&cfg); err != nil || cfg.ValidateAll() != nil {
					t.Fatalf("validator config: %v", err)
				}
			}
			back, err := DecodeSecret(Any{TypeURL: SecretTypeURL, Value: marshal(t, tc.want)})
			if err != nil {
				t.Fatal(err)
			}
			if back.Name != tc.s.Name || string(back.CertChain) != string(tc.s.CertChain) ||
				string(back.PrivateKey) != string(tc.s.PrivateKey) || string(back.TrustedCA) != string(tc.s.TrustedCA) ||
				!sameDomains(back.SPIFFE, tc.s.SPIFFE) {
				t.Fatalf("decoded %+v, want %+v", back, tc.s)
			}
		})
	}
}

func TestSecretsThatAreNotServedAreErrors(t *testing.T) {
	file := &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: "/etc/key.pem"}}
	for want, sec := range map[string]proto.Message{
		"secret without a name":           &tlsv3.Secret{},
		"unsupported type generic_secret": &tlsv3.Secret{Name: "g", Type: &tlsv3.Secret_GenericSecret{GenericSecret: &tlsv3.GenericSecret{}}},
		`secret "f": private_key: unsupported data source filename`: &tlsv3.Secret{Name: "f", Type: &tlsv3.Secret_TlsCertificate{
			TlsCertificate: &tlsv3.TlsCertificate{PrivateKey: file}}},
	} {
		if _, err := DecodeSecret(Any{TypeURL: SecretTypeURL, Value: marshal(t, sec)}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want %q", sec, err, want)
		}
	}
	if _, err := DecodeSecret(Any{TypeURL: "type.googleapis.com/x.Y"}); err == nil || !strings.Contains(err.Error(), "resource type") {
		t.Errorf("wrong type: %v", err)
	}
	// inline_string is inline; a later member of the oneof replaces an earlier one.
	b := marshal(t, &tlsv3.Secret{Name: "s", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "pem"}}}}})
	b = append(b, marshal(t, &tlsv3.Secret{Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "c"}}}}})...)
	s, err := DecodeSecret(Any{TypeURL: SecretTypeURL, Value: b})
	if err != nil || string(s.CertChain) != "c" || s.TrustedCA != nil {
		t.Fatalf("decoded %+v, %v", s, err)
	}
}

func sameDomains(a, b []TrustDomain) bool {
	return slices.EqualFunc(a, b, func(x, y TrustDomain) bool { return x.Name == y.Name && string(x.Bundle) == string(y.Bundle) })
}
