package xdswire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// SecretTypeURL is the type URL of an SDS secret.
const SecretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// SPIFFEValidatorName is Envoy's name of the SPIFFE certificate validator, and
// spiffeConfigTypeURL the type of its config.
const (
	SPIFFEValidatorName = "envoy.tls.cert_validator.spiffe"
	spiffeConfigTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig"
)

// Secret is an envoy.extensions.transport_sockets.tls.v3.Secret as the pod's
// roles serve and read it: a TlsCertificate (CertChain and PrivateKey, PEM), or
// a ValidationContext with TrustedCA (PEM) or with Envoy's SPIFFE certificate
// validator (SPIFFE: one bundle per trust domain; written, never read back).
type Secret struct {
	Name       string
	CertChain  []byte
	PrivateKey []byte
	TrustedCA  []byte
	SPIFFE     []TrustDomain
}

// TrustDomain is one trust domain of the SPIFFE validator: its name and PEM roots.
type TrustDomain struct {
	Name   string
	Bundle []byte
}

// IsCertificate reports whether s carries a certificate and key.
func (s Secret) IsCertificate() bool { return len(s.CertChain) > 0 && len(s.PrivateKey) > 0 }

// IsValidationContext reports whether s carries trusted roots.
func (s Secret) IsValidationContext() bool { return len(s.TrustedCA) > 0 }

// AppendWire appends s's wire form: a TlsCertificate when it has a certificate
// chain, else a ValidationContext (the SPIFFE validator when SPIFFE is set),
// every PEM inline.
func (s Secret) AppendWire(b []byte) []byte {
	b = AppendString(b, 1, s.Name)
	switch {
	case len(s.CertChain) > 0:
		return AppendMessage(b, 2, func(b []byte) []byte {
			return appendInline(appendInline(b, 1, s.CertChain), 2, s.PrivateKey)
		})
	case s.SPIFFE != nil:
		cfg := Any{TypeURL: spiffeConfigTypeURL}
		for _, td := range s.SPIFFE {
			cfg.Value = AppendMessage(cfg.Value, 1, func(b []byte) []byte {
				return appendInline(AppendString(b, 1, td.Name), 2, td.Bundle)
			})
		}
		return AppendMessage(b, 4, func(b []byte) []byte {
			return AppendMessage(b, 12, func(b []byte) []byte {
				return AppendAny(AppendString(b, 1, SPIFFEValidatorName), 2, cfg)
			})
		})
	default:
		return AppendMessage(b, 4, func(b []byte) []byte { return appendInline(b, 1, s.TrustedCA) })
	}
}

// appendInline appends the DataSource {inline_bytes: v} as the message field num.
func appendInline(b []byte, num protowire.Number, v []byte) []byte {
	return AppendMessage(b, num, func(b []byte) []byte { return AppendBytes(b, 2, v) })
}

// Any wraps s for a discovery response.
func (s Secret) Any() Any { return Any{TypeURL: SecretTypeURL, Value: s.AppendWire(nil)} }

// The members of Secret's type oneof.
const (
	secretNone           = 0
	secretTLSCertificate = 2
	secretSessionTickets = 3
	secretValidation     = 4
	secretGeneric        = 5
)

// DecodeSecret decodes one resource of an SDS response. Only inline data sources
// are accepted (SDS serves PEM inline); a secret of another kind (session ticket
// keys, a generic secret) or without a name is an error.
func DecodeSecret(a Any) (Secret, error) {
	if a.TypeURL != SecretTypeURL {
		return Secret{}, fmt.Errorf("resource type %q: want %q", a.TypeURL, SecretTypeURL)
	}
	var d secretFields
	if err := bytesFields(a.Value, d.field); err != nil {
		return Secret{}, fmt.Errorf("decode secret: %w", err)
	}
	if d.name == "" {
		return Secret{}, errors.New("secret without a name")
	}
	return d.secret()
}

// secretFields is a Secret as decoded so far: its name, and the member of its
// type oneof last set (kind) with that member's fields.
type secretFields struct {
	name string
	kind int
	// the oneof member as decoded so far: chain, key / trusted CA
	chain, key, ca dataSource
	// a validation context's custom validator: its typed config (merged
	// across repeated occurrences, as protobuf merges a message field)
	validator *validatorConfig
}

// field reads one length-delimited field of a Secret.
func (d *secretFields) field(f Field) error {
	switch f.Num {
	case 1:
		var err error
		d.name, err = f.String()
		return err
	case secretTLSCertificate, secretSessionTickets, secretValidation, secretGeneric:
		if d.kind != int(f.Num) { // another member of the oneof replaces the last
			*d = secretFields{name: d.name, kind: int(f.Num)}
		}
		switch f.Num {
		case secretTLSCertificate:
			return Fields(f.Bytes, func(f Field) error {
				switch {
				case f.Is(1, protowire.BytesType):
					return d.chain.merge(f.Bytes)
				case f.Is(2, protowire.BytesType):
					return d.key.merge(f.Bytes)
				}
				return nil
			})
		case secretValidation:
			return Fields(f.Bytes, func(f Field) error {
				switch {
				case f.Is(1, protowire.BytesType):
					return d.ca.merge(f.Bytes)
				case f.Is(12, protowire.BytesType):
					if d.validator == nil {
						d.validator = &validatorConfig{}
					}
					return d.validator.merge(f.Bytes)
				}
				return nil
			})
		}
	}
	return nil
}

// secret is the Secret d decoded to: its member's data sources inline.
func (d *secretFields) secret() (s Secret, err error) {
	s.Name = d.name
	switch d.kind {
	case secretTLSCertificate:
		if s.CertChain, err = d.chain.inline(); err != nil {
			return Secret{}, fmt.Errorf("secret %q: certificate_chain: %w", s.Name, err)
		}
		if s.PrivateKey, err = d.key.inline(); err != nil {
			return Secret{}, fmt.Errorf("secret %q: private_key: %w", s.Name, err)
		}
	case secretValidation:
		if s.TrustedCA, err = d.ca.inline(); err != nil {
			return Secret{}, fmt.Errorf("secret %q: trusted_ca: %w", s.Name, err)
		}
		if d.validator != nil {
			if s.SPIFFE, err = d.validator.spiffe(); err != nil {
				return Secret{}, fmt.Errorf("secret %q: custom_validator_config: %w", s.Name, err)
			}
		}
	case secretSessionTickets:
		return Secret{}, fmt.Errorf("secret %q: unsupported type session_ticket_keys", s.Name)
	case secretGeneric:
		return Secret{}, fmt.Errorf("secret %q: unsupported type generic_secret", s.Name)
	}
	return s, nil
}

// validatorConfig is a CertificateValidationContext's custom_validator_config
// (a TypedExtensionConfig) as far as decoded: its typed_config Any.
type validatorConfig struct {
	typeURL string
	value   []byte
	set     bool // typed_config present
}

// merge reads one occurrence of the TypedExtensionConfig b over v.
func (v *validatorConfig) merge(b []byte) error {
	return Fields(b, func(f Field) error {
		switch {
		case f.Is(1, protowire.BytesType): // name
			_, err := f.String()
			return err
		case f.Is(2, protowire.BytesType): // typed_config
			v.set = true
			return Fields(f.Bytes, func(f Field) error {
				var err error
				switch {
				case f.Is(1, protowire.BytesType):
					v.typeURL, err = f.String()
				case f.Is(2, protowire.BytesType):
					v.value = f.Bytes
				}
				return err
			})
		}
		return nil
	})
}

// spiffe decodes the config as Envoy's SPIFFECertValidatorConfig: its trust
// domains, each with its inline bundle. Another validator is an error.
func (v *validatorConfig) spiffe() ([]TrustDomain, error) {
	if !v.set || v.typeURL != spiffeConfigTypeURL {
		return nil, fmt.Errorf("unsupported validator config %q (want %s)", v.typeURL, spiffeConfigTypeURL)
	}
	tds := []TrustDomain{}
	err := Fields(v.value, func(f Field) error {
		if !f.Is(1, protowire.BytesType) {
			return nil
		}
		var td TrustDomain
		var bundle dataSource
		err := Fields(f.Bytes, func(f Field) error {
			var err error
			switch {
			case f.Is(1, protowire.BytesType):
				td.Name, err = f.String()
			case f.Is(2, protowire.BytesType):
				err = bundle.merge(f.Bytes)
			}
			return err
		})
		if err != nil {
			return err
		}
		if td.Bundle, err = bundle.inline(); err != nil {
			return fmt.Errorf("trust domain %q: trust_bundle: %w", td.Name, err)
		}
		tds = append(tds, td)
		return nil
	})
	return tds, err
}

// dataSource is an envoy.config.core.v3.DataSource's specifier: the field
// number of the member last set and its payload.
type dataSource struct {
	num protowire.Number
	v   []byte
}

// The members of DataSource's specifier oneof.
var dataSourceNames = map[protowire.Number]string{1: "filename", 2: "inline_bytes", 3: "inline_string", 4: "environment_variable"}

func (d *dataSource) merge(b []byte) error {
	return Fields(b, func(f Field) error {
		if _, ok := dataSourceNames[f.Num]; !ok || f.Type != protowire.BytesType {
			return nil
		}
		if f.Num != 2 { // strings
			if _, err := f.String(); err != nil {
				return err
			}
		}
		d.num, d.v = f.Num, f.Bytes
		return nil
	})
}

// inline is the source's bytes; a source that names a file or variable is an error.
func (d dataSource) inline() ([]byte, error) {
	switch d.num {
	case 0:
		return nil, nil
	case 2, 3:
		return d.v, nil
	default:
		return nil, fmt.Errorf("unsupported data source %s (only inline data is served over SDS)", dataSourceNames[d.num])
	}
}
