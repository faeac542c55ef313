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
		if err := build(dir, svc, packagePath(svc)); err != nil {
			return err
		}
	}
	return nil
}

// build builds the program at import path pkg into dir/name as make build does.
func build(dir, name, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", filepath.Join(dir, name), pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", name, err, out)
	}
	return nil
}
