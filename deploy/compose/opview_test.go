//go:build compose

package compose

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

// meshctlBin is the meshctl `make images` built ($MESHCTL overrides).
func meshctlBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("MESHCTL")
	if bin == "" {
		abs, err := filepath.Abs(filepath.Join("..", "..", "bin", "meshctl"))
		if err != nil {
			t.Fatal(err)
		}
		bin = abs
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("meshctl: %v (make build, or set MESHCTL)", err)
	}
	return bin
}

// meshctlOn runs meshctl with args against the stack's cluster, as the audit role
// over TLS, the way docs/security.md tells an operator to.
func (s *stack) meshctlOn(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	full := append(args, "-nats-url", s.urls(), "-nats-nkey", filepath.Join(s.secrets, "audit.nk"),
		"-nats-tls-ca", filepath.Join(s.secrets, "ca.pem"))
	out, err := exec.Command(bin, full...).CombinedOutput()
	return string(out), err
}

// operatorCommands: issue 29's commands against the compose stack (three NATS
// nodes, two signers, the operator service): proxy-status answers (the pod is
// proxyless: no ADS stream), describe shows the serial the pod serves over SDS, check passes naming
// every check, and bug-report writes a bundle holding each part.
func operatorCommands(t *testing.T, h *harness) {
	bin := meshctlBin(t)
	var out string
	var err error
	// The compose pod has no Envoy (its launcher runs it proxyless, gRPC xDS
	// bootstrap only): no ADS stream goes through its xds-relay, and proxy-status
	// must say so, not fail (against make run's stack, with Envoy's stand-in,
	// cmd/meshctl's TestProxyStatusAndDescribeAgainstTheStack checks the ACKs).
	out, err = h.st.meshctlOn(t, bin, "proxy-status")
	if err != nil || !strings.Contains(out, "no open ADS streams") {
		t.Fatalf("proxy-status against a proxyless pod: %v\n%s", err, out)
	}
	testkit.EventuallyWithin(t, time.Minute, "describe pod shows the serial demo-0 serves over SDS", func() bool {
		s := h.probe.Now()
		if !s.Up || s.Cur.Leaf == nil {
			return false
		}
		out, err = h.st.meshctlOn(t, bin, "describe", "pod", podRef.String())
		return err == nil && strings.Contains(out, "Pod:          "+podRef.String()) && strings.Contains(out, ", serial "+s.Cur.Serial()+",")
	})
	testkit.EventuallyWithin(t, time.Minute, "check passes", func() bool {
		out, err = h.st.meshctlOn(t, bin, "check")
		return err == nil && strings.Contains(out, "all checks passed")
	})
	for _, want := range []string{"ok   roles enforced", "ok   stream MESHAGENT_EVENTS", "ok   stream KV_meshagent_inventory", "ok   signers", "ok   clocks", "ok   CA material", "ok   certificates"} {
		if !strings.Contains(out, want) {
			t.Errorf("check lacks %q:\n%s", want, out)
		}
	}
	path := filepath.Join(t.TempDir(), "report.tar.gz")
	if out, err := h.st.meshctlOn(t, bin, "bug-report", "-o", path); err != nil || !strings.Contains(out, "wrote "+path) {
		t.Fatalf("bug-report: %v\n%s", err, out)
	}
	files := testkit.ReadTarGz(t, path, "meshagent-bug-report/")
	for name, want := range map[string]string{"version.txt": "meshctl ", "status.txt": "FLEET", "proxy-status.txt": "no open ADS streams",
		"certs.txt": pod, "events.jsonl": `"type":"io.meshagent.cert.issued.v1"`} {
		if !strings.Contains(files[name], want) {
			t.Errorf("bug report's %s lacks %q", name, want)
		}
	}
}
