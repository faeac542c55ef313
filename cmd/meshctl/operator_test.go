package main

// The operator's view against the real binaries: the inventory, the audit log, the
// status that fails when the fleet needs attention, inspect, the fleet metrics.

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/cli"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/tests/testkit"
)

// certsJSON runs meshctl certs -o json.
func certsJSON(t *testing.T, dir string) []inventory.Cert {
	t.Helper()
	out, err := meshctlOut(t, "certs", "-dir", dir, "-o", "json")
	if err != nil {
		t.Logf("certs: %v", err)
		return nil
	}
	var certs []inventory.Cert
	if err := json.Unmarshal([]byte(out), &certs); err != nil {
		t.Fatalf("certs -o json is not JSON: %v\n%s", err, out)
	}
	return certs
}

// podCert waits until the inventory lists pod with a serial not in not, and returns it.
func podCert(t *testing.T, dir, pod string, not ...string) inventory.Cert {
	t.Helper()
	var got inventory.Cert
	testkit.EventuallyWithin(t, time.Minute, "meshctl certs lists "+pod+" with a new certificate", func() bool {
		for _, c := range certsJSON(t, dir) {
			if c.Pod == devstack.DemoNamespace+"/"+pod && !slices.Contains(not, c.Serial) {
				got = c
				return true
			}
		}
		return false
	})
	return got
}

func TestOperatorView(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 1, LeafTTL: time.Hour, RootRotateMinInterval: rotateMin})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dashboard == "" {
		t.Fatal("stack.json names no dashboard")
	}
	first := podCert(t, dir, "demo-0")
	if first.SPIFFEID != st.Pods[0].SPIFFEID || first.Signer != "signer-0" {
		t.Fatalf("inventory record: %+v", first)
	}

	t.Run("certs as a table", func(t *testing.T) {
		out, err := meshctl(t, "certs", "-dir", dir, "-o", "wide")
		if err != nil || !strings.Contains(out, "demo-0") || !strings.Contains(out, first.Serial[:16]) || !strings.Contains(out, "EXPIRES IN") {
			t.Fatalf("certs -o wide: %v\n%s", err, out)
		}
		if _, err := meshctl(t, "certs", "-dir", dir, "-o", "yaml"); err == nil || !strings.Contains(err.Error(), "-o") {
			t.Fatalf("-o yaml: %v", err)
		}
	})

	t.Run("events replays a pod's history", func(t *testing.T) {
		out, err := meshctl(t, "events", "-dir", dir, "--since", "10m", "--pod", "demo-0")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"reading MESHAGENT_EVENTS from", "retention 7d / 1024 MiB", "pod.up", "cert.issued", "serial=" + first.Serial[:8]} {
			if !strings.Contains(out, want) {
				t.Errorf("events -since 10m -pod demo-0 lacks %q:\n%s", want, out)
			}
		}
		js, err := meshctlOut(t, "events", "-dir", dir, "-since", "10m", "-type", "cert.issued", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(js), "\n")
		for _, l := range lines {
			var e struct{ Type, Pod string }
			if err := json.Unmarshal([]byte(l), &e); err != nil || e.Type != "io.meshagent.cert.issued.v1" {
				t.Fatalf("json line %q: %v", l, err)
			}
		}
		if _, err := meshctl(t, "events", "-dir", dir, "-since", "yesterday"); err == nil || !strings.Contains(err.Error(), "-since") {
			t.Fatalf("bad -since: %v", err)
		}
		if _, err := meshctl(t, "events", "-dir", dir, "-type", "cert.isued"); err == nil || !strings.Contains(err.Error(), "-type") {
			t.Fatalf("bad -type: %v", err)
		}
	})

	t.Run("inspect by pod, serial and file", func(t *testing.T) {
		for _, what := range []string{"demo-0", first.Serial[:10], filepath.Join(st.Pods[0].OutputCerts, certdir.ChainFile)} {
			out, err := meshctl(t, "inspect", "-dir", dir, what)
			if err != nil || !strings.Contains(out, "SPIFFE ID   "+first.SPIFFEID) || !strings.Contains(out, "verifies    yes") {
				t.Fatalf("inspect %s: %v\n%s", what, err, out)
			}
		}
		if out, err := meshctl(t, "inspect", "-dir", dir, "no-such-pod"); err == nil {
			t.Fatalf("inspect of nothing succeeded:\n%s", out)
		}
	})

	t.Run("fleet metrics", func(t *testing.T) {
		testkit.Eventually(t, "fleet metrics count demo-0's certificate", func() bool {
			code, body := testkit.HTTPGet("http://" + st.Dashboard + "/metrics")
			return code == 200 && strings.Contains(body, `meshagent_fleet_certificates{expires_in="1h"} 1`) &&
				strings.Contains(body, `meshagent_fleet_pods{state="up"} 1`) && strings.Contains(body, "meshagent_fleet_root_expiry_seconds{")
		})
	})

	t.Run("a root rotation followed across the fleet", func(t *testing.T) {
		var out string
		var err error
		// Before the forced renewal below: the rotator keeps the older of two
		// certificates issued within one second (same notBefore), so its root-rotation
		// renewal would name a replaced serial, which the pod ignores as stale.
		testkit.EventuallyWithin(t, 3*rotateMin+5*time.Second, "rotate root: still too soon", func() bool {
			var b testkit.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			err = cli.Run(ctx, cli.Env{Stdout: &b, Stderr: &b, Getenv: func(string) string { return "" }},
				[]string{"rotate", "-dir", dir, "root", "-wait", "90s"})
			out = b.String()
			return err == nil || !strings.Contains(err.Error(), "allowed at")
		})
		if err != nil || !strings.Contains(out, "1/1 live pod certificate(s) under the new root") {
			certs, _ := meshctl(t, "certs", "-dir", dir, "-o", "wide")
			log, _ := meshctl(t, "events", "-dir", dir, "-since", "5m", "-type", "cert.issued,trust.changed,rotation.renew_due", "-o", "json")
			t.Fatalf("rotate root -wait: %v\n%s\ninventory:\n%s\nevents:\n%s", err, out, certs, log)
		}
		fp := rotatedRoot(out)
		for _, want := range []string{"plan: phase 3", "now: phase", "the old root leaves the bundle at"} {
			if !strings.Contains(out, want) {
				t.Fatalf("rotate root printed no %q:\n%s", want, out)
			}
		}
		if c := podCert(t, dir, "demo-0"); c.Root != fp {
			t.Fatalf("demo-0's certificate is under %s, not the new root %s", c.Root, fp)
		}
	})

	t.Run("a forced renewal shows in the inventory and the log", func(t *testing.T) {
		if out, err := meshctl(t, "rotate", "-dir", dir, "pod", "demo-0"); err != nil {
			t.Fatalf("rotate pod: %v\n%s", err, out)
		}
		next := podCert(t, dir, "demo-0", first.Serial)
		if next.Renewals < 1 {
			t.Fatalf("renewal not counted: %+v", next)
		}
		// Polled: the inventory has the certificate once the signer announced it,
		// the pod's push of it comes after.
		var out string
		if !testkit.Poll(testkit.Timeout, func() bool {
			out, _ = meshctl(t, "events", "-dir", dir, "-since", "10m", "-pod", "demo-0", "-type", "sds.pushed")
			return strings.Contains(out, "serial="+next.Serial[:8])
		}) {
			t.Fatalf("the new certificate's push is not in the log:\n%s", out)
		}
	})

	t.Run("the last hour's counts outlive the history and an operator restart", func(t *testing.T) {
		checkCountersOutliveHistory(t, dir, st)
	})

	t.Run("status is well, then fails with the signer stopped", func(t *testing.T) {
		out, err := meshctl(t, "status", "-dir", dir)
		if err != nil || !strings.Contains(out, "all well") || !strings.Contains(out, "1 up, 0 down") {
			t.Fatalf("status: %v\n%s", err, out)
		}
		pid := 0
		for _, p := range st.Processes {
			if p.Name == "signer" {
				pid = p.PID
			}
		}
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, "status fails naming the signer", func() bool {
			out, err = meshctl(t, "status", "-dir", dir)
			return err != nil && strings.Contains(out, "NOT ANSWERING") && strings.Contains(out, "NEEDS ATTENTION")
		})
	})
}

// meshctlOut is meshctl's standard output alone (stderr says where events come from).
func meshctlOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb testkit.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cli.Run(ctx, cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}, args)
	return out.String(), err
}

// rotatedRoot is the new root's fingerprint from meshctl rotate root's output ("" if none).
func rotatedRoot(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "new root sha256 "); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strings.TrimSuffix(f[0], ";")
			}
		}
	}
	return ""
}
