package house

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCIFitsItsNinetyMinutes keeps what makes `.ci/run` fit CI's 90 minutes on a
// loaded machine (issue 37: 94.5 min at load 20–50, 45 of them `go vet`
// compiling the Kubernetes test dependencies): one vet of every package with the
// kube- and istio-tagged tests in it, which `make test-kube` and `make test-istio`
// then do not repeat; the Go
// caches where CI keeps them (~/.cache); and the dashboard test's bench with a
// deadline that holds under load.
func TestCIFitsItsNinetyMinutes(t *testing.T) {
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(repoRelToHouse, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	mk, ci := read("Makefile"), read(".ci/run")
	for _, c := range []struct {
		what string
		re   string
		in   string
	}{
		{"make vet vets the kube-tagged tests too", `(?m)^vet:\n\t\$\(GO\) vet -tags \$\(VET_TAGS\) \$\(PKGS\)$`, mk},
		{"VET_TAGS is kube and istio", `(?m)^VET_TAGS \?= kube,istio$`, mk},
		{"make test-kube skips its vet when vetted", `(?m)^\t@\[ "\$\(VETTED\)" = 1 \] \|\| \$\(GO\) vet -tags kube`, mk},
		{"make test-istio skips its vet when vetted", `(?m)^\t@\[ "\$\(VETTED\)" = 1 \] \|\| \$\(GO\) vet -tags istio`, mk},
		{".ci/run says test-kube is vetted", `(?m)make test-kube VETTED=1$`, ci},
		{".ci/run says test-istio is vetted", `(?m)make test-istio VETTED=1$`, ci},
		{".ci/run keeps the modules under ~/.cache", `(?m)^export GOMODCACHE="\$\{GOMODCACHE:-\$HOME/\.cache/`, ci},
		{".ci/run keeps the build cache under ~/.cache", `(?m)^export GOCACHE="\$\{GOCACHE:-\$HOME/\.cache/`, ci},
		{"the dashboard bench's deadline holds under load", `"-request-timeout", "5m"`, read("cmd/meshctl/dashboard_test.go")},
	} {
		if !regexp.MustCompile(c.re).MatchString(c.in) {
			t.Errorf("%s: no match for %s", c.what, c.re)
		}
	}
	if strings.Count(mk, "$(GO) vet ") != 3 {
		t.Errorf("the Makefile vets in %d places, want make vet and make test-kube's and make test-istio's guarded ones", strings.Count(mk, "$(GO) vet "))
	}
}
