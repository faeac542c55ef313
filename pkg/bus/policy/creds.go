package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
)

// Keys are the public half of a credential set: what a server's configuration needs
// and all it needs.
type Keys struct {
	Users  map[Role]string // user nkey (U...) of each role in Users
	Issuer string          // account nkey (A...) that signs the callout's pod users
}

// Credentials is a credential set on disk: one nkey seed file per role in Users and
// the callout issuer's seed, each 0600 in Dir.
type Credentials struct {
	Dir  string
	Keys Keys
}

// SeedFile is the seed file of role r (a role in Users).
func (c *Credentials) SeedFile(r Role) string { return filepath.Join(c.Dir, string(r)+".nk") }

// IssuerFile is the seed file of the callout issuer.
func (c *Credentials) IssuerFile() string { return filepath.Join(c.Dir, "callout-issuer.nk") }

// LoadOrGenerate reads the credential set in dir, generating (once) every seed that
// is missing. dir is created 0700; existing seeds are reused, never replaced.
func LoadOrGenerate(dir string) (*Credentials, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials dir: %w", err)
	}
	c := &Credentials{Dir: dir, Keys: Keys{Users: map[Role]string{}}}
	for _, r := range Users {
		pub, err := loadOrCreate(c.SeedFile(r), nkeys.CreateUser, nkeys.PrefixByteUser)
		if err != nil {
			return nil, fmt.Errorf("%s credential: %w", r, err)
		}
		c.Keys.Users[r] = pub
	}
	pub, err := loadOrCreate(c.IssuerFile(), nkeys.CreateAccount, nkeys.PrefixByteAccount)
	if err != nil {
		return nil, fmt.Errorf("callout issuer: %w", err)
	}
	c.Keys.Issuer = pub
	return c, nil
}

func loadOrCreate(path string, create func() (nkeys.KeyPair, error), want nkeys.PrefixByte) (string, error) {
	kp, err := ReadSeed(path, want)
	if err == nil {
		return kp.PublicKey()
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	kp, err = create()
	if err != nil {
		return "", err
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	// O_EXCL: two stacks starting at once on one dir never overwrite each other's seed.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	_, werr := f.Write(append(seed, '\n'))
	if err := errors.Join(werr, f.Close()); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return kp.PublicKey()
}

// maxSeedFile bounds a seed file: a seed is 58 characters.
const maxSeedFile = 4 << 10

// ReadSeed reads an nkey seed file and checks that it holds the wanted kind of key.
// The pair it returns derives its signing key once (signingKey).
// A seed is a password: a file that others, or a group this process is not in,
// may read is refused (OpenSecret).
func ReadSeed(path string, want nkeys.PrefixByte) (nkeys.KeyPair, error) {
	data, err := ReadSecret(path, maxSeedFile)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(data))))
	if err != nil {
		return nil, fmt.Errorf("%s: not an nkey seed: %w", path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if nkeys.Prefix(pub) != want {
		return nil, fmt.Errorf("%s: not the seed of an nkey of kind %s", path, want)
	}
	fast, err := newSigningKey(kp)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return fast, nil
}
