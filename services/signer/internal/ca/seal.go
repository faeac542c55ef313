package ca

import (
	"bytes"
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/pki"
)

// KEKSize is the length of the key-encryption key: AES-256.
const KEKSize = 32

// maxKEKFile bounds what LoadKEK reads: a base64 KEK with a newline is 45 bytes.
const maxKEKFile = 1 << 10

// ErrUnseal is returned when a sealed CA key does not open under this signer's KEK.
var ErrUnseal = errors.New("cannot unseal CA key: wrong -ca-kek-file?")

// KEK is the key-encryption key that seals the self-signed CA's private keys in KV
// (AES-256-GCM). It never leaves the signer process.
type KEK struct {
	aead cipher.AEAD
}

// LoadKEK reads a KEK file: 32 random bytes, raw or base64 (standard or URL
// alphabet, padded or not, surrounding whitespace ignored). The file must be
// readable by its owner only, or also by its group when that is this process's
// group (a Kubernetes Secret with an fsGroup): policy.OpenSecret.
func LoadKEK(path string) (*KEK, error) {
	if path == "" {
		return nil, errors.New("-ca-kek-file: required in self-signed mode")
	}
	f, err := policy.OpenSecret(path)
	if err != nil {
		return nil, fmt.Errorf("-ca-kek-file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKEKFile+1))
	if err != nil {
		return nil, fmt.Errorf("-ca-kek-file: %w", err)
	}
	key, err := parseKEK(data)
	if err != nil {
		return nil, fmt.Errorf("-ca-kek-file: %s: %w", path, err)
	}
	k, err := NewKEK(key)
	if err != nil {
		return nil, fmt.Errorf("-ca-kek-file: %s: %w", path, err)
	}
	return k, nil
}

func parseKEK(data []byte) ([]byte, error) {
	if len(data) == KEKSize {
		return data, nil
	}
	if len(data) > maxKEKFile {
		return nil, fmt.Errorf("want %d random bytes, raw or base64; the file is larger than %d bytes", KEKSize, maxKEKFile)
	}
	s := string(bytes.TrimSpace(data))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == KEKSize {
			return b, nil
		}
	}
	return nil, fmt.Errorf("want %d random bytes, raw or base64; got %d bytes that are neither", KEKSize, len(data))
}

// NewKEK returns a KEK from 32 bytes.
func NewKEK(key []byte) (*KEK, error) {
	if len(key) != KEKSize {
		return nil, fmt.Errorf("kek: want %d bytes, got %d", KEKSize, len(key))
	}
	if bytes.Equal(key, make([]byte, KEKSize)) {
		return nil, errors.New("kek: all zero bytes: use 32 random bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("kek: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("kek: %w", err)
	}
	return &KEK{aead: aead}, nil
}

// sealedKey is a CA private key as KV stores it: PKCS#8 DER sealed with AES-256-GCM.
// The additional data binds it to the trust domain and to KeyID, so a blob cannot be
// moved to another record or presented as another key.
type sealedKey struct {
	KeyID      string `json:"key_id"` // pki.KeyID of the public key
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

// sealAAD is the additional authenticated data of a sealed key.
func sealAAD(trustDomain, keyID string) []byte {
	return []byte("meshagent-ca-key-v1\x00" + trustDomain + "\x00" + keyID)
}

// seal encrypts key for the record of trustDomain.
func (k *KEK) seal(trustDomain string, key crypto.Signer) (sealedKey, error) {
	id, err := pki.KeyID(key.Public())
	if err != nil {
		return sealedKey{}, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return sealedKey{}, fmt.Errorf("seal ca key: %w", err)
	}
	defer clear(der)
	nonce := make([]byte, k.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return sealedKey{}, fmt.Errorf("seal ca key: %w", err)
	}
	return sealedKey{KeyID: id, Nonce: nonce, Ciphertext: k.aead.Seal(nil, nonce, der, sealAAD(trustDomain, id))}, nil
}

// open decrypts a sealed key and checks that it is the key KeyID names.
func (k *KEK) open(trustDomain string, s sealedKey) (crypto.Signer, error) {
	if len(s.Nonce) != k.aead.NonceSize() {
		return nil, fmt.Errorf("%w (sealed key %.16s: bad nonce)", ErrUnseal, s.KeyID)
	}
	der, err := k.aead.Open(nil, s.Nonce, s.Ciphertext, sealAAD(trustDomain, s.KeyID))
	if err != nil {
		return nil, fmt.Errorf("%w (sealed key %.16s, trust domain %s)", ErrUnseal, s.KeyID, trustDomain)
	}
	defer clear(der)
	parsed, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("sealed key %.16s: %w", s.KeyID, err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("sealed key %.16s: %T is not a signing key", s.KeyID, parsed)
	}
	if id, err := pki.KeyID(key.Public()); err != nil || id != s.KeyID {
		return nil, fmt.Errorf("sealed key %.16s: holds another key", s.KeyID)
	}
	return key, nil
}
