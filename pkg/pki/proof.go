package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
)

// SignProof proves possession of key for a renewal with a still-valid certificate:
// a signature over the SHA-256 of the new CSR's DER bytes (ASN.1 ECDSA, or RSA
// PKCS#1 v1.5). Binding the proof to the CSR stops it being replayed for another key.
func SignProof(key crypto.Signer, csrDER []byte) ([]byte, error) {
	sum := sha256.Sum256(csrDER)
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("sign proof: %w", err)
	}
	return sig, nil
}

// VerifyProof checks a SignProof signature against the certificate's public key.
func VerifyProof(pub crypto.PublicKey, csrDER, sig []byte) error {
	sum := sha256.Sum256(csrDER)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if !ecdsa.VerifyASN1(k, sum[:], sig) {
			return errors.New("proof: ECDSA signature does not verify")
		}
		return nil
	case *rsa.PublicKey:
		if err := rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig); err != nil {
			return fmt.Errorf("proof: %w", err)
		}
		return nil
	}
	return fmt.Errorf("proof: unsupported key type %T", pub)
}
