package config

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadResolvesPathsUnderPodRoot(t *testing.T) {
	c, err := Load([]string{"-pod", "web-0", "-pod-root", "/pods/web-0"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if c.SDSSocket != filepath.Join("/pods/web-0", "var/run/secrets/workload-spiffe-uds/socket") {
		t.Fatalf("sds socket %s", c.SDSSocket)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	_, err := Load([]string{"-drain-time", "-1s", "-wait-for", "0s", "-log-level", "loud"}, func(string) string { return "" })
	if err == nil {
		t.Fatal("want error")
	}
	for _, f := range []string{"-pod", "-drain-time", "-wait-for", "-log-level"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
}
