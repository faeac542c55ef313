package devstack

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// SecretDirs are the local stack's directories of private material, under its
// Dir: "secrets" (the bus credentials and callout issuer seed, the bus TLS CA and
// its key, the CA's key-encryption key, the partner signer's CA key, the node
// API's bearer token) and "issuer" (the key that signs every pod's token). No pod
// root is under them and none of them is under a pod root, so no file-cert: or
// file-root: name a pod's proxy may ask sds-edge for reaches them (sds-edge's
// -file-cert-dirs default to directories under the pod root).
var SecretDirs = []string{"secrets", "issuer"}

// publicFile reports whether a file in a secret directory holds only public
// material (certificates, a JWKS), which may stay readable.
func publicFile(name string) bool {
	return strings.HasSuffix(name, "cert.pem") || strings.HasSuffix(name, "chain.pem") || name == "ca.pem" ||
		strings.HasSuffix(name, ".jwks") || strings.HasSuffix(name, "jwks.json")
}

// protectSecrets makes the secret directories (and every directory below them)
// 0700 and every file in them that is not public 0600, tightening what an older
// meshctl, a copy or an umask left looser. In a single-user local stack every
// process runs as the same user, so these modes keep the material from other
// users of the machine, not from the stack's own processes: what keeps a pod from
// serving it is sds-edge's directory confinement (docs/security.md).
func protectSecrets(dir string, log hclog.Logger) error {
	for _, d := range SecretDirs {
		root := filepath.Join(dir, d)
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if p == root && os.IsNotExist(err) {
					return nil // made on this start, strict from the first byte
				}
				return err
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			want := fi.Mode().Perm()
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				return nil // its target is checked where it lives, if it is ours
			case fi.IsDir():
				want = 0o700
			case fi.Mode().IsRegular() && !publicFile(e.Name()):
				want &= 0o600
			}
			if want != fi.Mode().Perm() {
				if err := os.Chmod(p, want); err != nil {
					return err
				}
				log.Warn("tightened the mode of stack secret material", "path", p, "was", fmt.Sprintf("%#o", fi.Mode().Perm()), "now", fmt.Sprintf("%#o", want))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("protect %s: %w", root, err)
		}
	}
	return nil
}
