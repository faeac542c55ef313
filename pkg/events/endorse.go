package events

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Endorsement vouches for a trust bundle: a signature by a CA key over EndorsedBytes
// of the bundle. A receiver accepts a new bundle only when one of its endorsements
// verifies under a key it already trusts: the key of a trusted root, or (when Chain is
// set) the key of Chain[0], a CA certificate whose chain verifies to a trusted root —
// the signing intermediate of a plugged-in CA, whose root key is offline. So a new root
// is announced under the signature of the old one (with the default same-key rotation
// the two keys are one), and a publisher without a CA key cannot add a root.
//
// The signature is ASN.1 ECDSA or RSA PKCS#1 v1.5 over the SHA-256 of EndorsedBytes,
// base64 (standard, padded); KeyID is the hex SHA-256 of the signing key's
// SubjectPublicKeyInfo DER, so a receiver can find the key without trying each root.
type Endorsement struct {
	KeyID     string   `json:"key_id"`
	Signature string   `json:"signature"`
	Chain     []string `json:"chain,omitempty"` // PEM, signing certificate first, root excluded
}

// endorsedTag versions the bytes an endorsement covers.
const endorsedTag = "meshagent-trust-bundle-v1"

// EndorsedBytes is what an Endorsement signs: the trust domain, the generation and
// the SHA-256 of each root's DER in order, one per line. Roots are PEM; an entry that
// is not a PEM certificate is an error.
func EndorsedBytes(trustDomain string, generation uint64, roots []string) ([]byte, error) {
	if trustDomain == "" || strings.ContainsAny(trustDomain, "\n") {
		return nil, errors.New("endorse: bad trust domain")
	}
	var b strings.Builder
	b.WriteString(endorsedTag + "\n" + trustDomain + "\n" + strconv.FormatUint(generation, 10) + "\n")
	for i, r := range roots {
		blk, _ := pem.Decode([]byte(r))
		if blk == nil || blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("endorse: roots[%d]: not a PEM certificate", i)
		}
		sum := sha256.Sum256(blk.Bytes)
		b.WriteString(hex.EncodeToString(sum[:]) + "\n")
	}
	return []byte(b.String()), nil
}
