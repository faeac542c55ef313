// Package pki holds the key, CSR, PEM and SPIFFE ID helpers shared by the signer
// (which checks them) and sds-edge (which makes them), so that both agree on
// algorithms, encodings and identities.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// KeyAlg names a key algorithm and size.
type KeyAlg string

// Supported key algorithms.
const (
	ECP256  KeyAlg = "EC-P256"
	ECP384  KeyAlg = "EC-P384"
	RSA2048 KeyAlg = "RSA-2048"
	RSA3072 KeyAlg = "RSA-3072"
	RSA4096 KeyAlg = "RSA-4096"
)

// KeyAlgs lists the supported algorithms.
var KeyAlgs = []KeyAlg{ECP256, ECP384, RSA2048, RSA3072, RSA4096}

// ParseKeyAlg accepts the names above, case-insensitively, and the short forms
// "ecdsa"/"ec"/"p256" (P-256), "p384", "rsa" (RSA-2048).
func ParseKeyAlg(s string) (KeyAlg, error) {
	switch s {
	case "EC-P256", "ec-p256", "ecdsa", "ECDSA", "ec", "EC", "p256", "P256", "P-256":
		return ECP256, nil
	case "EC-P384", "ec-p384", "p384", "P384", "P-384":
		return ECP384, nil
	case "RSA-2048", "rsa-2048", "rsa", "RSA", "rsa2048":
		return RSA2048, nil
	case "RSA-3072", "rsa-3072", "rsa3072":
		return RSA3072, nil
	case "RSA-4096", "rsa-4096", "rsa4096":
		return RSA4096, nil
	}
	return "", fmt.Errorf("unknown key algorithm %q (want one of %v)", s, KeyAlgs)
}

// GenerateKey makes a new private key.
func GenerateKey(alg KeyAlg) (crypto.Signer, error) {
	switch alg {
	case ECP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ECP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case RSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	}
	return nil, fmt.Errorf("unknown key algorithm %q", alg)
}

// ErrWeakKey is returned for public keys meshagent will not certify.
var ErrWeakKey = errors.New("key algorithm or size not allowed")

// AlgOf names the algorithm of a public key, and rejects keys that are too weak
// (RSA under 2048 bits, curves other than P-256 and P-384, anything else).
func AlgOf(pub crypto.PublicKey) (KeyAlg, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return ECP256, nil
		case elliptic.P384():
			return ECP384, nil
		}
		return "", fmt.Errorf("%w: ECDSA curve %s", ErrWeakKey, k.Curve.Params().Name)
	case *rsa.PublicKey:
		bits := k.N.BitLen()
		switch {
		case bits < 2048:
			return "", fmt.Errorf("%w: RSA %d bits (minimum 2048)", ErrWeakKey, bits)
		case bits <= 2048:
			return RSA2048, nil
		case bits <= 3072:
			return RSA3072, nil
		case bits <= 4096:
			return RSA4096, nil
		}
		return "", fmt.Errorf("%w: RSA %d bits (maximum 4096)", ErrWeakKey, bits)
	}
	return "", fmt.Errorf("%w: %T", ErrWeakKey, pub)
}

// EncodeKeyPEM encodes a private key: PKCS#8 ("PRIVATE KEY") when pkcs8 is true,
// else SEC 1 ("EC PRIVATE KEY") or PKCS#1 ("RSA PRIVATE KEY") as Istio writes them.
func EncodeKeyPEM(key crypto.Signer, pkcs8 bool) ([]byte, error) {
	if pkcs8 {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("encode key: %w", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("encode key: %w", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
	case *rsa.PrivateKey:
		return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), nil
	}
	return nil, fmt.Errorf("encode key: unsupported key type %T", key)
}

// ParseKeyPEM reads the first private key in data, in any of the encodings above.
func ParseKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("parse key: no private key PEM block")
		}
		var (
			k   any
			err error
		)
		switch b.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("parse key: %w", err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("parse key: %T cannot sign", k)
		}
		return s, nil
	}
}
