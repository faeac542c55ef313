package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/testkit"
)

// TestProxyStatusAndDescribeAgainstTheStack: against meshctl up's stack (a demo pod
// whose Envoy stand-in holds an ADS stream through its xds-relay to the demo control
// plane), proxy-status shows the pod's stream, its upstream and the versions
// ACKed per type, and describe pod shows the pod's identity, certificate, roots,
// xDS and recent events in one view.
func TestProxyStatusAndDescribeAgainstTheStack(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 1, LeafTTL: time.Hour})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	serial := podCert(t, dir, "demo-0").Serial
	var out string
	testkit.EventuallyWithin(t, time.Minute, "proxy-status shows demo-0's ADS stream with CDS and LDS ACKed", func() bool {
		out, err = meshctl(t, "proxy-status", "-dir", dir)
		return err == nil && strings.Contains(out, "default/demo-0") && strings.Contains(out, st.ControlPlane.XDSAddr) &&
			strings.Contains(out, "CDS") && strings.Contains(out, "LDS") && strings.Count(out, "ACK ") >= 2
	})
	if strings.Contains(out, "NACK") {
		t.Fatalf("proxy-status:\n%s", out)
	}
	if out, err := meshctl(t, "proxy-status", "-dir", dir, "default/nobody"); err != nil || !strings.Contains(out, "no open ADS streams") {
		t.Fatalf("proxy-status of an unknown pod: %v\n%s", err, out)
	}

	out, err = meshctl(t, "describe", "-dir", dir, "-events", "50", "pod", "demo-0")
	if err != nil {
		t.Fatalf("describe pod: %v\n%s", err, out)
	}
	for _, want := range []string{"Pod:          default/demo-0", "Identity:     " + st.Pods[0].SPIFFEID, serial, "(in the trust bundle)",
		"Roots:", "xDS:", "CDS  ACK", "Recent events", "cert.issued", "xds.acked", "ACK type.googleapis.com/envoy.config.listener.v3.Listener version="} {
		if !strings.Contains(out, want) {
			t.Errorf("describe pod lacks %q:\n%s", want, out)
		}
	}
	if out, err := meshctl(t, "describe", "-dir", dir, "pod", "default/nobody"); err == nil || !strings.Contains(err.Error(), "not in the inventory") {
		t.Fatalf("describe of an unknown pod: %v\n%s", err, out)
	}
	if _, err := meshctl(t, "describe", "-dir", dir, "demo-0"); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Fatalf("describe without pod: %v", err)
	}

	// The pre-flight passes on a healthy stack, every check named.
	out, err = meshctl(t, "check", "-dir", dir)
	if err != nil || !strings.Contains(out, "all checks passed") {
		t.Fatalf("check: %v\n%s", err, out)
	}
	// The support bundle: every part there, none holding a credential.
	bundlePath := filepath.Join(t.TempDir(), "report.tar.gz")
	if out, err := meshctl(t, "bug-report", "-dir", dir, "-o", bundlePath); err != nil || !strings.Contains(out, "wrote "+bundlePath) {
		t.Fatalf("bug-report: %v\n%s", err, out)
	}
	files := untar(t, bundlePath)
	for name, want := range map[string]string{"version.txt": "meshctl ", "status.txt": "FLEET", "check.txt": "all checks passed",
		"proxy-status.txt": "default/demo-0", "certs.txt": serial[:12], "events.jsonl": `"type":"io.meshagent.cert.issued.v1"`,
		"trust.txt": "cluster.local", "stack.json": `"nats_url"`, "logs/signer.log": ""} {
		if got, ok := files[name]; !ok || !strings.Contains(got, want) {
			t.Errorf("bug report's %s (present %v) lacks %q", name, ok, want)
		}
	}
	for name, data := range files {
		if strings.Contains(data, "PRIVATE KEY-----\n") || regexp.MustCompile(`\bSU[A-Z2-7]{50,}`).MatchString(data) {
			t.Errorf("bug report's %s holds a private key or an nkey seed", name)
		}
	}
	for _, want := range []string{"ok   roles enforced", "ok   stream MESHAGENT_EVENTS", "ok   stream MESHAGENT_POD_EVENTS",
		"ok   stream KV_meshagent_inventory", "ok   signers", "ok   clocks", "ok   CA material", "ok   certificates"} {
		if !strings.Contains(out, want) {
			t.Errorf("check lacks %q:\n%s", want, out)
		}
	}
}

// untar reads a .tar.gz into file name (without its top directory) -> content.
func untar(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "meshagent-bug-report/")] = string(data)
	}
}
