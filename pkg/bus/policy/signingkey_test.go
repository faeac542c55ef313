package policy

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// The pair ReadSeed returns signs, names itself and verifies exactly as nkeys'
// own pair of the same seed, a JWT it signs decodes as that account's, and Wipe
// leaves it unable to sign.
func TestSigningKeySignsAsTheNkeyPair(t *testing.T) {
	orig, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := orig.Seed()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "issuer.nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	kp, err := ReadSeed(path, nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := kp.(*signingKey); !ok {
		t.Fatalf("ReadSeed returned %T, not the pair that keeps its key", kp)
	}
	want, _ := orig.PublicKey()
	if got, err := kp.PublicKey(); err != nil || got != want {
		t.Fatalf("public key %q (%v), want %q", got, err, want)
	}
	for _, msg := range [][]byte{nil, []byte("x"), bytes.Repeat([]byte("nonce"), 100)} {
		a, err := kp.Sign(msg)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := orig.Sign(msg)
		if !bytes.Equal(a, b) {
			t.Fatalf("signature of %q differs from nkeys'", msg)
		}
		if err := orig.Verify(msg, a); err != nil {
			t.Fatal(err)
		}
		if err := kp.Verify(msg, b); err != nil {
			t.Fatal(err)
		}
		if err := kp.Verify(append([]byte("tampered"), msg...), a); !errors.Is(err, nkeys.ErrInvalidSignature) {
			t.Fatalf("a signature over other bytes verified: %v", err)
		}
	}
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(upub)
	token, err := uc.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	back, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatalf("a JWT it signed does not decode: %v", err)
	}
	if back.Issuer != want {
		t.Fatalf("issuer %q, want %q", back.Issuer, want)
	}
	kp.Wipe()
	if _, err := kp.Sign([]byte("x")); err == nil {
		t.Fatal("a wiped pair still signs")
	}
	if _, err := kp.PublicKey(); err == nil {
		t.Fatal("a wiped pair still names a key")
	}
}

// Two JWTs a callout answer encodes, with nkeys' pair and with the kept key
// (go test -bench SigningKey ./pkg/bus/policy).
func BenchmarkSigningKey(b *testing.B) {
	orig, _ := nkeys.CreateAccount()
	fast, err := newSigningKey(orig)
	if err != nil {
		b.Fatal(err)
	}
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	for _, c := range []struct {
		name string
		kp   nkeys.KeyPair
	}{{"nkeys", orig}, {"kept", fast}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				for range 2 {
					if _, err := jwt.NewUserClaims(upub).Encode(c.kp); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
