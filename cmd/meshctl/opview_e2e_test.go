package main

import (
	"crypto/x509"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
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
	podCert(t, dir, "demo-0") // the inventory holds demo-0
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

	// describe shows the certificate the pod serves Envoy: the serial SDS hands out.
	served := pki.SerialHex(sdsLeaf(t, st))
	testkit.EventuallyWithin(t, 30*time.Second, "describe pod shows the serial demo-0 serves over SDS", func() bool {
		out, err = meshctl(t, "describe", "-dir", dir, "-events", "50", "pod", "demo-0")
		return err == nil && strings.Contains(out, ", serial "+served+", current")
	})
	serial := served
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
	files := testkit.ReadTarGz(t, bundlePath, "meshagent-bug-report/")
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
	checkFailsWithTheSignerFrozen(t, dir, st)
	for _, want := range []string{"ok   roles enforced", "ok   stream MESHAGENT_EVENTS", "ok   stream MESHAGENT_POD_EVENTS",
		"ok   stream KV_meshagent_inventory", "ok   signers", "ok   clocks", "ok   CA material", "ok   certificates"} {
		if !strings.Contains(out, want) {
			t.Errorf("check lacks %q:\n%s", want, out)
		}
	}
}

// sdsLeaf is the leaf demo-0 serves over SDS as "default", verified against the
// trust bundle.
func sdsLeaf(t *testing.T, st *stackfile.Stack) *x509.Certificate {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	cc, err := sdsclient.DialUnix(ctx, st.Pods[0].SDSSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	secrets, err := sdsclient.Fetch(ctx, cc, "sidecar~describe", "default")
	if err != nil {
		t.Fatal(err)
	}
	return verifyLeaf(t, secrets["default"], st.TrustBundle)
}

// checkFailsWithTheSignerFrozen: with the stack's signer stopped (SIGSTOP: the
// supervisor sees no exit and starts none in its place), check exits non-zero with
// a FAIL line naming the signers and what to do; resumed, it passes again.
func checkFailsWithTheSignerFrozen(t *testing.T, dir string, st *stackfile.Stack) {
	t.Helper()
	pid := 0
	for _, p := range st.Processes {
		if p.Name == "signer" {
			pid = p.PID
		}
	}
	if pid == 0 {
		t.Fatal("stack.json lists no signer")
	}
	resume := freeze(t, pid)
	out, err := meshctl(t, "check", "-dir", dir)
	resume()
	if err == nil || !strings.Contains(err.Error(), "check(s) failed") {
		t.Fatalf("check with the signer stopped: %v\n%s", err, out)
	}
	for _, want := range []string{"FAIL signers", "no signer answers a trust bundle request", "fix: start a signer", "ok   roles enforced"} {
		if !strings.Contains(out, want) {
			t.Errorf("check with the signer stopped lacks %q:\n%s", want, out)
		}
	}
	testkit.EventuallyWithin(t, time.Minute, "check passes with the signer resumed", func() bool {
		out, err = meshctl(t, "check", "-dir", dir)
		return err == nil && strings.Contains(out, "all checks passed")
	})
}
