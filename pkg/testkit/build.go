package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildServices builds the named services (services/<name>) into dir as `make build`
// does (static, -trimpath, the grpcnotrace tag), for tests that run the real
// binaries. It needs the go tool and the meshagent workspace.
func BuildServices(dir string, names ...string) error {
	for _, svc := range names {
		cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", filepath.Join(dir, svc),
			"github.com/meshagent/meshagent/services/"+svc)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", svc, err, out)
		}
	}
	return nil
}
