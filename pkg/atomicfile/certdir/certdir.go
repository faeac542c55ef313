// Package certdir is the layout of Istio's OUTPUT_CERTS directory: key.pem (0600),
// cert-chain.pem and root-cert.pem, written the way Istio's agent writes them. sds-edge
// keeps a pod's directory current with it; meshctl sign -out writes one; meshctl
// status reads them by these names.
package certdir

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshagent/meshagent/pkg/atomicfile"
)

// File names, as Istio's agent writes them.
const (
	KeyFile   = "key.pem"
	ChainFile = "cert-chain.pem"
	RootFile  = "root-cert.pem"
)

// Write replaces the three files in dir (made 0755 if missing), each atomically
// and with its final mode from the start (atomicfile): a reader sees the old file or
// the new one. The roots are written first and the key last, so that a reader who
// sees a new key also sees the chain and roots that go with it.
func Write(dir string, keyPEM, chainPEM, rootsPEM []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{RootFile, rootsPEM, 0o644}, {ChainFile, chainPEM, 0o644}, {KeyFile, keyPEM, 0o600}} {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}
