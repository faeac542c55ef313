package xdswire

import (
	"maps"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
)

// FuzzWireDecode feeds the same bytes to this package and to the generated types, as
// requests (what sds-edge reads from Envoy) and as a secret (what clients read):
// whatever the generated types accept must decode here to the same values. This
// package may accept more (it does not check UTF-8 in fields it skips).
func FuzzWireDecode(f *testing.F) {
	f.Add(marshal(f, &discoveryv3.DiscoveryRequest{VersionInfo: "1", Node: &corev3.Node{Id: "n", Cluster: "c"},
		ResourceNames: []string{"default"}, TypeUrl: SecretTypeURL, ResponseNonce: "x", ErrorDetail: &statuspb.Status{Code: 3, Message: "m"}}))
	f.Add(marshal(f, &discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: SecretTypeURL, ResourceNamesSubscribe: []string{"a"},
		ResourceNamesUnsubscribe: []string{"b"}, InitialResourceVersions: map[string]string{"a": "1"}, ResponseNonce: "x",
		ErrorDetail: &statuspb.Status{Message: "m"}}))
	f.Add((Secret{Name: "default", CertChain: []byte("c"), PrivateKey: []byte("k")}).AppendWire(nil))
	f.Add((Secret{Name: "ROOTCA", TrustedCA: []byte("r")}).AppendWire(nil))
	f.Add((Secret{Name: "ROOTCA_SPIFFE", SPIFFE: []TrustDomain{{"a", []byte("r")}, {"b.example", []byte("s")}}}).AppendWire(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var sotw discoveryv3.DiscoveryRequest
		if proto.Unmarshal(b, &sotw) == nil {
			var got DiscoveryRequest
			if err := got.UnmarshalWire(b); err != nil {
				t.Fatalf("generated types accept it, DiscoveryRequest: %v", err)
			}
			if got.VersionInfo != sotw.VersionInfo || got.NodeID != sotw.GetNode().GetId() || !slices.Equal(got.ResourceNames, sotw.ResourceNames) ||
				got.TypeURL != sotw.TypeUrl || got.ResponseNonce != sotw.ResponseNonce || !sameStatus(got.ErrorDetail, sotw.ErrorDetail) {
				t.Fatalf("decoded %+v, generated types %v", got, &sotw)
			}
		}
		var delta discoveryv3.DeltaDiscoveryRequest
		if proto.Unmarshal(b, &delta) == nil {
			var got DeltaDiscoveryRequest
			if err := got.UnmarshalWire(b); err != nil {
				t.Fatalf("generated types accept it, DeltaDiscoveryRequest: %v", err)
			}
			if got.NodeID != delta.GetNode().GetId() || got.TypeURL != delta.TypeUrl || !slices.Equal(got.Subscribe, delta.ResourceNamesSubscribe) ||
				!slices.Equal(got.Unsubscribe, delta.ResourceNamesUnsubscribe) || !maps.Equal(got.InitialResourceVersions, delta.InitialResourceVersions) ||
				got.ResponseNonce != delta.ResponseNonce || !sameStatus(got.ErrorDetail, delta.ErrorDetail) {
				t.Fatalf("decoded %+v, generated types %v", got, &delta)
			}
		}
		var sec tlsv3.Secret
		if proto.Unmarshal(b, &sec) == nil {
			got, err := DecodeSecret(Any{TypeURL: SecretTypeURL, Value: b})
			want, ok, unread := secretOf(&sec)
			// A SPIFFE config the generated types refuse may be refused for a field
			// this package does not read (it skips them unchecked): accepting it is
			// allowed, with the values it does read.
			if (err == nil) != ok && !(err == nil && unread) {
				t.Fatalf("secret %v: error %v", &sec, err)
			}
			if err == nil && ok && (got.Name != want.Name || string(got.CertChain) != string(want.CertChain) ||
				string(got.PrivateKey) != string(want.PrivateKey) || string(got.TrustedCA) != string(want.TrustedCA) ||
				!sameDomains(got.SPIFFE, want.SPIFFE)) {
				t.Fatalf("decoded %+v, generated types %v", got, &sec)
			}
		}
	})
}

func sameStatus(s *Status, p *statuspb.Status) bool {
	if s == nil || p == nil {
		return s == nil && p == nil
	}
	return s.Code == p.Code && s.Message == p.Message
}

// secretOf is what DecodeSecret should make of sec, read through the generated
// types; ok is false when it should refuse it. unread is true when the refusal is
// the SPIFFE validator config not decoding as Envoy's type, which may be a field
// DecodeSecret skips.
func secretOf(sec *tlsv3.Secret) (s Secret, ok, unread bool) {
	s.Name = sec.GetName()
	inline := func(d *corev3.DataSource) ([]byte, bool) {
		switch v := d.GetSpecifier().(type) {
		case nil:
			return nil, true
		case *corev3.DataSource_InlineBytes:
			return v.InlineBytes, true
		case *corev3.DataSource_InlineString:
			return []byte(v.InlineString), true
		}
		return nil, false
	}
	var okChain, okKey bool
	switch t := sec.GetType().(type) {
	case nil:
		return s, s.Name != "", false
	case *tlsv3.Secret_TlsCertificate:
		s.CertChain, okChain = inline(t.TlsCertificate.GetCertificateChain())
		s.PrivateKey, okKey = inline(t.TlsCertificate.GetPrivateKey())
		return s, s.Name != "" && okChain && okKey, false
	case *tlsv3.Secret_ValidationContext:
		s.TrustedCA, ok = inline(t.ValidationContext.GetTrustedCa())
		if v := t.ValidationContext.GetCustomValidatorConfig(); v != nil {
			var cfg tlsv3.SPIFFECertValidatorConfig
			if v.GetTypedConfig() == nil || v.GetTypedConfig().GetTypeUrl() != spiffeConfigTypeURL {
				return s, false, false
			}
			if proto.Unmarshal(v.GetTypedConfig().GetValue(), &cfg) != nil {
				return s, false, true
			}
			s.SPIFFE = []TrustDomain{}
			for _, td := range cfg.GetTrustDomains() {
				b, okB := inline(td.GetTrustBundle())
				if !okB {
					return s, false, false
				}
				s.SPIFFE = append(s.SPIFFE, TrustDomain{Name: td.GetName(), Bundle: b})
			}
		}
		return s, s.Name != "" && ok, false
	}
	return s, false, false
}
