package main

import (
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
}
