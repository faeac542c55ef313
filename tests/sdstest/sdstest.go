// Package sdstest builds, with go-control-plane's generated types, the SDS
// secrets that tests serve from a real go-control-plane server to the pod's
// roles (which read them with pkg/xdswire): an independent reference for what
// those roles must understand. For tests only.
package sdstest

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/meshagent/meshagent/pkg/sdsclient"
)

// EnvoySecret is s as Envoy's Secret: a TlsCertificate when s has a certificate,
// else a ValidationContext with its trusted CA, every PEM inline.
func EnvoySecret(s sdsclient.Secret) *tlsv3.Secret {
	inline := func(b []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
	}
	out := &tlsv3.Secret{Name: s.Name}
	if len(s.CertChain) > 0 {
		out.Type = &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(s.CertChain), PrivateKey: inline(s.PrivateKey)}}
		return out
	}
	out.Type = &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inline(s.TrustedCA)}}
	return out
}
