package pod

import (
	"testing"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

func TestBindReadsFlagsOverEnvAndPathResolvesUnderTheRoot(t *testing.T) {
	var c Config
	fs := flagenv.New("x", func(k string) string { return map[string]string{"POD_NAME": "env-pod", "POD_ROOT": "/pods/env"}[k] })
	c.Bind(fs)
	if err := fs.Parse([]string{"-pod", "web-0"}); err != nil {
		t.Fatal(err)
	}
	if c.ID != "web-0" || c.RootDir != "/pods/env" {
		t.Fatalf("pod %q root %q", c.ID, c.RootDir)
	}
	for p, want := range map[string]string{"etc/certs": "/pods/env/etc/certs", "/abs/x": "/abs/x", "": ""} {
		if got := c.Path(p); got != want {
			t.Errorf("Path(%q) = %q, want %q", p, got, want)
		}
	}
	var d Config
	d.Bind(flagenv.New("y", nil))
	if d.RootDir != DefaultRoot || d.Path("a") != "a" {
		t.Fatalf("default root %q, Path(a) %q", d.RootDir, d.Path("a"))
	}
}
