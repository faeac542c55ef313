package sdsclient

import (
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// SecretTypeURL is the type URL of an SDS secret.
const SecretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// Well-known resource names, as Istio's agent serves them.
const (
	ResourceDefault = "default"
	ResourceRootCA  = "ROOTCA"
)

// Secret is one decoded SDS secret: a TlsCertificate (CertChain and PrivateKey, PEM),
// a ValidationContext (TrustedCA, PEM), or both empty when the server sent neither.
type Secret struct {
	Name       string
	CertChain  []byte
	PrivateKey []byte
	TrustedCA  []byte
}

// IsCertificate reports whether s carries a certificate and key.
func (s Secret) IsCertificate() bool { return len(s.CertChain) > 0 && len(s.PrivateKey) > 0 }

// IsValidationContext reports whether s carries trusted roots.
func (s Secret) IsValidationContext() bool { return len(s.TrustedCA) > 0 }

// DecodeSecret decodes one resource of an SDS response.
func DecodeSecret(a *anypb.Any) (Secret, error) {
	if a.GetTypeUrl() != SecretTypeURL {
		return Secret{}, fmt.Errorf("resource type %q: want %q", a.GetTypeUrl(), SecretTypeURL)
	}
	var s tlsv3.Secret
	if err := a.UnmarshalTo(&s); err != nil {
		return Secret{}, fmt.Errorf("decode secret: %w", err)
	}
	out := Secret{Name: s.GetName()}
	if out.Name == "" {
		return Secret{}, fmt.Errorf("secret without a name")
	}
	var err error
	switch t := s.GetType().(type) {
	case *tlsv3.Secret_TlsCertificate:
		if out.CertChain, err = inline(t.TlsCertificate.GetCertificateChain()); err != nil {
			return Secret{}, fmt.Errorf("secret %q: certificate_chain: %w", out.Name, err)
		}
		if out.PrivateKey, err = inline(t.TlsCertificate.GetPrivateKey()); err != nil {
			return Secret{}, fmt.Errorf("secret %q: private_key: %w", out.Name, err)
		}
	case *tlsv3.Secret_ValidationContext:
		if out.TrustedCA, err = inline(t.ValidationContext.GetTrustedCa()); err != nil {
			return Secret{}, fmt.Errorf("secret %q: trusted_ca: %w", out.Name, err)
		}
	case nil:
	default:
		return Secret{}, fmt.Errorf("secret %q: unsupported type %T", out.Name, t)
	}
	return out, nil
}

func inline(ds *corev3.DataSource) ([]byte, error) {
	switch s := ds.GetSpecifier().(type) {
	case nil:
		return nil, nil
	case *corev3.DataSource_InlineBytes:
		return s.InlineBytes, nil
	case *corev3.DataSource_InlineString:
		return []byte(s.InlineString), nil
	default:
		return nil, fmt.Errorf("unsupported data source %T (only inline data is served over SDS)", s)
	}
}

// EncodeSecret builds the SDS resource for s: a TlsCertificate when it has a
// certificate, else a ValidationContext. Servers and tests use it.
func EncodeSecret(s Secret) *tlsv3.Secret {
	out := &tlsv3.Secret{Name: s.Name}
	if len(s.CertChain) > 0 {
		out.Type = &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: s.CertChain}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: s.PrivateKey}},
		}}
		return out
	}
	out.Type = &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: s.TrustedCA}},
	}}
	return out
}
