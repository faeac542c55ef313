package house

import (
	"os/exec"
	"strings"
	"testing"
)

// podBinaries are the pod's binaries, which link no go-control-plane Envoy
// package: registering the generated Envoy types costs every pod process
// megabytes (docs/benchmarks.md, "Per-pod memory"; +2.4 MB PSS and +3.8 MB of
// binary for the Wasm rewrite alone). They speak xDS through pkg/xdswire.
var podBinaries = []string{"./cmd/meshagent", "./services/xds-relay"}

// envoyModule is the prefix of the packages the pod must not link.
const envoyModule = "github.com/envoyproxy/"

// deps is `go list -deps` of pkgs, run at the repository's root (the workspace).
func deps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...)
	cmd.Dir = repoRelToHouse
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %v: %v\n%s", pkgs, err, msg)
	}
	return strings.Fields(string(out))
}

// envoyPackages are the packages of list from github.com/envoyproxy.
func envoyPackages(list []string) []string {
	var out []string
	for _, p := range list {
		if strings.HasPrefix(p, envoyModule) {
			out = append(out, p)
		}
	}
	return out
}

// TestPodLinksNoEnvoyTypes: go list -deps of the pod's binaries names no
// github.com/envoyproxy package (tests may import them; binaries may not).
func TestPodLinksNoEnvoyTypes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the workspace")
	}
	for _, pkg := range podBinaries {
		if e := envoyPackages(deps(t, pkg)); len(e) > 0 {
			t.Errorf("%s links %d github.com/envoyproxy packages, e.g. %s (hand-decode with pkg/xdswire instead)", pkg, len(e), e[0])
		}
	}
}

// TestPodLinksNoEnvoyTypesCatchesOne is the control: a package list that has
// an Envoy package is caught, the real one of a package importing go-control-
// plane's discovery types included, and the pod's lists are not empty.
func TestPodLinksNoEnvoyTypesCatchesOne(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the workspace")
	}
	if e := envoyPackages([]string{"fmt", "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"}); len(e) != 1 {
		t.Fatalf("a list with one Envoy package: found %v", e)
	}
	if e := envoyPackages(deps(t, "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3")); len(e) == 0 {
		t.Fatal("go list -deps of Envoy's discovery types found no Envoy package")
	}
	if d := deps(t, podBinaries...); len(d) < 50 {
		t.Fatalf("go list -deps of the pod's binaries listed %d packages: the check above would pass on nothing", len(d))
	}
}
