package policy

import (
	"crypto/ed25519"
	"errors"

	"github.com/nats-io/nkeys"
)

// signingKey is an nkey pair that derives its Ed25519 key once. nkeys' own pair
// keeps only the seed and derives the key from it on every Sign and PublicKey (a
// scalar multiplication each): the auth callout encodes two JWTs per connection
// (the user and the response), which paid for four of them, a fifth of the
// signer's CPU in a connection storm (pprof, docs/scale.md). Ed25519 signatures
// are deterministic, so a signingKey signs exactly as the pair it wraps.
type signingKey struct {
	nkeys.KeyPair
	public string
	priv   ed25519.PrivateKey
}

// FastSigner returns kp deriving its Ed25519 key once (see signingKey): for an
// issuer made in memory (nkeys.CreateAccount) that signs every admission, as
// ReadSeed's are.
func FastSigner(kp nkeys.KeyPair) (nkeys.KeyPair, error) { return newSigningKey(kp) }

// newSigningKey wraps kp, a pair made from a seed (a public-only pair has no
// private key to keep and is returned as it is).
func newSigningKey(kp nkeys.KeyPair) (nkeys.KeyPair, error) {
	public, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return kp, nil
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, err
	}
	if len(raw) != ed25519.SeedSize {
		return nil, errors.New("nkey seed of an unexpected size")
	}
	return &signingKey{KeyPair: kp, public: public, priv: ed25519.NewKeyFromSeed(raw)}, nil
}

func (k *signingKey) PublicKey() (string, error) {
	if k.priv == nil {
		return "", nkeys.ErrInvalidSeed
	}
	return k.public, nil
}

func (k *signingKey) Sign(input []byte) ([]byte, error) {
	if k.priv == nil {
		return nil, nkeys.ErrInvalidSeed
	}
	return ed25519.Sign(k.priv, input), nil
}

func (k *signingKey) Verify(input, sig []byte) error {
	if k.priv == nil {
		return nkeys.ErrInvalidSeed
	}
	if !ed25519.Verify(k.priv.Public().(ed25519.PublicKey), input, sig) {
		return nkeys.ErrInvalidSignature
	}
	return nil
}

// Wipe clears the derived key as well as the seed.
func (k *signingKey) Wipe() {
	clear(k.priv)
	k.priv = nil
	k.KeyPair.Wipe()
}
