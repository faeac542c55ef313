package devstack

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// CAKEK returns dir/secrets/ca-kek, the key-encryption key sealing the signer's CA
// key in KV: 32 random bytes, mode 0600, made on the first run and reused after, so
// the root in dir/nats survives restarts.
func CAKEK(dir string) (string, error) {
	secrets := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		return "", fmt.Errorf("secrets dir: %w", err)
	}
	p := filepath.Join(secrets, "ca-kek")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return p, nil // the signer checks its mode and content
	}
	if err != nil {
		return "", fmt.Errorf("ca kek: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		_ = f.Close()
		_ = os.Remove(p)
		return "", fmt.Errorf("ca kek: %w", err)
	}
	_, err = f.Write(key)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
		return "", fmt.Errorf("ca kek: %w", err)
	}
	return p, nil
}
