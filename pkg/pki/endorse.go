package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
)

// KeyID names a public key: the hex SHA-256 of its SubjectPublicKeyInfo DER.
func KeyID(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("key id: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// Endorse signs msg (a trust bundle's events.EndorsedBytes) with a CA key and returns
// the key's id and the base64 signature: ASN.1 ECDSA or RSA PKCS#1 v1.5 over SHA-256.
func Endorse(key crypto.Signer, msg []byte) (keyID, sig string, err error) {
	if keyID, err = KeyID(key.Public()); err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(msg)
	raw, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return "", "", fmt.Errorf("endorse: %w", err)
	}
	return keyID, base64.StdEncoding.EncodeToString(raw), nil
}

// ErrNotEndorsed says that no endorsement verifies under a trusted key.
var ErrNotEndorsed = errors.New("not endorsed by a trusted root")

// VerifyEndorsement reports whether sig over msg verifies under a trusted key whose
// KeyID is keyID: a trusted root's, or, when chain is not empty, chain[0]'s, a CA
// certificate that chains (through chain[1:]) to one of the trusted roots.
func VerifyEndorsement(trusted []*x509.Certificate, msg []byte, keyID, sig string, chain []*x509.Certificate) error {
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		return fmt.Errorf("endorsement: signature: %w", err)
	}
	sum := sha256.Sum256(msg)
	if len(chain) > 0 {
		if err := verifyCAChain(trusted, chain); err != nil {
			return fmt.Errorf("endorsement chain: %w: %w", err, ErrNotEndorsed)
		}
		trusted = chain[:1]
	}
	for _, c := range trusted {
		id, err := KeyID(c.PublicKey)
		if err != nil || id != keyID {
			continue
		}
		switch k := c.PublicKey.(type) {
		case *ecdsa.PublicKey:
			if ecdsa.VerifyASN1(k, sum[:], raw) {
				return nil
			}
		case *rsa.PublicKey:
			if rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], raw) == nil {
				return nil
			}
		}
		return fmt.Errorf("endorsement by key %.16s: signature does not verify: %w", keyID, ErrNotEndorsed)
	}
	return fmt.Errorf("endorsement by key %.16s: no trusted root has that key: %w", keyID, ErrNotEndorsed)
}

// verifyCAChain checks that chain[0] is a CA certificate valid now that verifies
// through chain[1:] to one of roots.
func verifyCAChain(roots, chain []*x509.Certificate) error {
	if !chain[0].IsCA {
		return errors.New("endorsing certificate is not a CA")
	}
	rp, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rp.AddCert(r)
	}
	for _, c := range chain[1:] {
		ip.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: rp, Intermediates: ip, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
