package pki

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
)

// EncodeCertPEM encodes one certificate.
func EncodeCertPEM(c *x509.Certificate) []byte { return encodePEM("CERTIFICATE", c.Raw) }

// encodePEM is pem.EncodeToMemory of a block without headers, byte for byte, in
// one allocation: a signer encodes every leaf it issues, and encoding/pem's
// buffered base64 writer allocates kilobytes per block.
func encodePEM(typ string, der []byte) []byte {
	const line = 48 // DER bytes per 64-character base64 line
	n := base64.StdEncoding.EncodedLen(len(der))
	out := make([]byte, 0, len("-----BEGIN -----\n-----END -----\n")+2*len(typ)+n+(n+63)/64)
	out = append(append(append(out, "-----BEGIN "...), typ...), "-----\n"...)
	for len(der) > 0 {
		k := min(line, len(der))
		out = append(base64.StdEncoding.AppendEncode(out, der[:k]), '\n')
		der = der[k:]
	}
	return append(append(append(out, "-----END "...), typ...), "-----\n"...)
}

// EncodeCertsPEM encodes certificates in order into one PEM bundle.
func EncodeCertsPEM(cs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range cs {
		buf.Write(EncodeCertPEM(c))
	}
	return buf.Bytes()
}

// CertPEMs encodes each certificate as its own PEM string (the shape of events and
// of Istio's cert_chain).
func CertPEMs(cs []*x509.Certificate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = string(EncodeCertPEM(c))
	}
	return out
}

// ParseCertsPEM parses every CERTIFICATE block in data. Other block types and text
// between blocks are an error: a bundle must hold certificates only.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := bytes.TrimSpace(data)
	for len(rest) > 0 {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("parse certificates: malformed PEM")
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("parse certificates: unexpected PEM block %q", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificates: %w", err)
		}
		out = append(out, c)
		rest = bytes.TrimSpace(rest)
	}
	if len(out) == 0 {
		return nil, errors.New("parse certificates: no CERTIFICATE block")
	}
	return out, nil
}

// ParseCertPEMs parses a list of PEM strings, each holding one or more certificates.
func ParseCertPEMs(pems []string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for i, p := range pems {
		cs, err := ParseCertsPEM([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
		out = append(out, cs...)
	}
	return out, nil
}

// Fingerprint is the lowercase hex SHA-256 of a certificate's DER.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// SerialHex is the certificate serial as lowercase hex, as events carry it.
func SerialHex(c *x509.Certificate) string { return c.SerialNumber.Text(16) }
