// Package pod is the pod a pod-side process serves (sds-edge, xds-relay, the
// launcher): its id and its filesystem root, read from the same flags and env vars
// by every one of them, and the one rule for their paths: a relative path is under
// the pod root.
package pod

import (
	"path/filepath"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

// Config names the pod.
type Config struct {
	ID      string // -pod, POD_NAME
	RootDir string // -pod-root, POD_ROOT: the pod's filesystem root
}

// DefaultRoot is the pod root when none is given: the working directory.
const DefaultRoot = "."

// Bind registers -pod / POD_NAME and -pod-root / POD_ROOT on fs, with c's values
// as their defaults (a zero RootDir: DefaultRoot).
func (c *Config) Bind(fs *flagenv.Set) {
	if c.RootDir == "" {
		c.RootDir = DefaultRoot
	}
	fs.String(&c.ID, "pod", "POD_NAME", c.ID, "pod id (required)")
	fs.String(&c.RootDir, "pod-root", "POD_ROOT", c.RootDir, "pod root directory; relative paths are under it")
}

// Path is p under the pod root; an absolute or empty p is returned as it is.
func (c Config) Path(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(c.RootDir, p)
}
