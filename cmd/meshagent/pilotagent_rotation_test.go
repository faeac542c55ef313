package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// rotationTTL is the certificates' lifetime in the pilot-agent rotation test (the
// pods' SECRET_TTL, pilot-agent's too, and the signer's default); rotationMaxTTL the
// signer's maximum. A new-key rotation's phases outlast the longest leaf signed
// before each (+ 1 min), so the whole rotation takes about 7 minutes.
const (
	rotationTTL    = time.Minute
	rotationMaxTTL = 2 * time.Minute
)

// TestPilotAgentThroughNewKeyRotation runs Istio's real pilot-agent (PILOT_AGENT_BIN;
// docs/benchmarks.md says how it was built) as a sidecar agent of `meshctl up`'s
// signer over Istio's gRPC API (CA_ADDR, its istio-token, TLS checked against its
// mounted root), then rotates the root to a new key and follows it through every
// phase to the old root's retirement. The mounted root (what Istio mounts from the
// istio-ca-root-cert ConfigMap) stays the old root alone throughout, as a restarted
// agent's would until the ConfigMap is updated, and the agent is restarted in phase
// 2 to show it still reaches the CA. At each phase boundary and after the agent's
// first renewal in each phase, the certificate it serves over SDS is unexpired and
// verifies, in Go, with `openssl verify` and in a BoringSSL handshake, under what its peers trust: the
// meshagent pod's ROOTCA, the agent's own ROOTCA, and the old root alone while its
// chain reaches it. No sample of what it served shows an expired certificate.
//
// Skipped unless PILOT_AGENT_BIN and MESHAGENT_BIN (meshctl, meshagent and
// envoy-standin, as make bench builds them) are set:
//
//	PILOT_AGENT_BIN=/path/to/pilot-agent MESHAGENT_BIN=$PWD/bin \
//	  go test -count=1 -run TestPilotAgentThroughNewKeyRotation -v ./cmd/meshagent/
func TestPilotAgentThroughNewKeyRotation(t *testing.T) {
	pa, bin := os.Getenv("PILOT_AGENT_BIN"), os.Getenv("MESHAGENT_BIN")
	if pa == "" || bin == "" {
		t.Skip("PILOT_AGENT_BIN and MESHAGENT_BIN not both set: no real pilot-agent to rotate under")
	}
	for _, f := range []string{"meshctl", "meshagent", "envoy-standin"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			t.Fatalf("no %s in MESHAGENT_BIN: %v", f, err)
		}
	}
	testkit.TLSTool(t, testkit.StackOpenSSL)
	testkit.TLSTool(t, testkit.StackBoringSSL)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := startStack(ctx, t, bin)
	st := readStack(t, dir)
	nc := adminBus(ctx, t, st.NATSURL, st.NATSAdminNKey)
	oldRoots := bundleRoots(ctx, t, nc)
	if len(oldRoots) != 1 {
		t.Fatalf("the fresh stack's bundle holds %d roots, want 1", len(oldRoots))
	}
	old := oldRoots[0]
	pod := faultcheck.WatchPod(ctx, st.Pods[0].SDSSocket, "rotation-test~pod", "", 250*time.Millisecond)

	work := t.TempDir()
	copyFile(t, st.Pods[0].TokenFile, filepath.Join(work, "var/run/secrets/tokens/istio-token"))
	// The mounted root: the old root alone, for the whole rotation.
	if err := os.MkdirAll(filepath.Join(work, "var/run/secrets/istio"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "var/run/secrets/istio/root-cert.pem"), pki.EncodeCertPEM(old), 0o600); err != nil {
		t.Fatal(err)
	}
	sdsSocket := filepath.Join(work, "var/run/secrets/workload-spiffe-uds/socket")
	// Each agent process is watched by its own SDS stream, as its Envoy would be;
	// watched holds them all, for the expiry check at the end.
	var watched []*faultcheck.PodWatch
	watch := func() *faultcheck.PodWatch {
		wctx, stop := context.WithCancel(ctx)
		t.Cleanup(stop)
		w := faultcheck.WatchPod(wctx, sdsSocket, "rotation-test~pilot-agent", "", 250*time.Millisecond)
		watched = append(watched, w)
		return w
	}
	agent := startPilotAgent(ctx, t, work, pa, bin, st)
	w := watch()
	var first faultcheck.Sample
	testkit.EventuallyWithin(t, time.Minute, "pilot-agent's first certificate over SDS", func() bool {
		first = w.Now()
		return first.Cur.Leaf != nil && len(first.Cur.Roots) > 0
	})
	check := func(what string, s faultcheck.Sample) {
		t.Helper()
		checkAgentCert(t, what, s, old, pod.Now().Cur.Roots)
	}
	check("before the rotation", first)

	reply := rotateNewKey(ctx, t, nc)
	plan := reply.Plan
	t.Logf("rotated to %s: phase 2 at +%s, phase 3 at +%s, old root leaves at +%s", reply.Fingerprint[:12],
		plan.NewRootLast.Sub(plan.Rotated).Round(time.Second), plan.Settled.Sub(plan.Rotated).Round(time.Second),
		plan.OldRootLeaves.Sub(plan.Rotated).Round(time.Second))
	// Every certificate pilot-agent serves from now to the old root's retirement is
	// checked when first seen (the plan's times are upper bounds: a phase ends earlier
	// once the leaves issued in it are known to be short). At the first chain of
	// phase 2 the agent is restarted, as a rescheduled pod's would be, with the same
	// mounted root: the old one alone.
	var newRoot *x509.Certificate
	for _, r := range bundleRoots(ctx, t, nc) {
		if !r.Equal(old) {
			newRoot = r
		}
	}
	if newRoot == nil {
		t.Fatal("no new root in the bundle after the rotation")
	}
	rc := faultcheck.RotationChains{Old: old, New: newRoot}
	began := map[int]time.Time{}
	last, checked, restarted := faultcheck.ShapeUnknown, map[string]bool{}, false
	var bundleAsked time.Time
	retired := false
	if !testkit.Poll(time.Until(plan.OldRootLeaves.Add(time.Minute)), func() bool {
		if last == faultcheck.ShapeNewRoot && time.Since(bundleAsked) > 2*time.Second {
			bundleAsked = time.Now()
			roots := bundleRoots(ctx, t, nc)
			retired = len(roots) == 1 && roots[0].Equal(newRoot)
		}
		s := w.Now()
		if s.Cur.Leaf == nil || checked[s.Cur.Serial()] {
			return retired
		}
		checked[s.Cur.Serial()] = true
		shape := rc.Shape(s.Cur.Chain)
		switch {
		case shape == faultcheck.ShapeUnknown:
			t.Errorf("pilot-agent serves %s: a chain of no phase (%d certificates)", s.Cur.Serial(), len(s.Cur.Chain))
		case shape < last:
			t.Errorf("pilot-agent serves %s, of phase %d, after one of phase %d", s.Cur.Serial(), shape, last)
		case shape > last:
			at, _ := w.FirstServed(s.Cur.Serial())
			began[shape] = at
			t.Logf("phase %d: first served by pilot-agent %s after the rotation", shape, at.Sub(plan.Rotated).Round(100*time.Millisecond))
			last = shape
		}
		check(fmt.Sprintf("phase %d", shape), s)
		if shape == faultcheck.ShapeCrossNew && !restarted {
			restarted = true
			agent.stop()
			agent = startPilotAgent(ctx, t, work, pa, bin, st)
			w = watch()
			testkit.EventuallyWithin(t, time.Minute, "the restarted pilot-agent's certificate", func() bool { return w.Now().Cur.Leaf != nil })
			t.Logf("restarted pilot-agent (mounted root: the old one alone) serves %s", w.Now().Cur.Serial())
		}
		return false
	}) {
		t.Fatalf("the old root was not retired by %s (the plan's time + 1 min)", plan.OldRootLeaves.Add(time.Minute).Format(time.TimeOnly))
	}
	for _, shape := range []int{faultcheck.ShapeCrossOld, faultcheck.ShapeCrossNew, faultcheck.ShapeNewRoot} {
		if began[shape].IsZero() {
			t.Errorf("pilot-agent never served a chain of phase %d", shape)
		}
	}
	if !restarted {
		t.Error("pilot-agent was never restarted in phase 2")
	}
	t.Logf("old root retired +%s after the rotation (plan: +%s); %d certificates of pilot-agent checked",
		time.Since(plan.Rotated).Round(time.Second), plan.OldRootLeaves.Sub(plan.Rotated).Round(time.Second), len(checked))
	check("old root gone", w.Now())
	// What every agent served while its SDS stream was open: never expired.
	samples := 0
	for _, aw := range watched {
		for _, s := range aw.Since(plan.Rotated) {
			if !s.Up {
				continue
			}
			samples++
			if s.Expired() {
				t.Errorf("pilot-agent served %s at %s, expired at %s", s.Cur.Serial(), s.At.Format(time.TimeOnly), s.Cur.Leaf.NotAfter.Format(time.TimeOnly))
				break
			}
		}
	}
	t.Logf("%d samples of what pilot-agent served over SDS from the rotation to the old root's retirement", samples)
	agent.stop()
}

// checkAgentCert: s shows an unexpired certificate whose chain verifies, in Go and
// with OpenSSL, under the meshagent pod's ROOTCA (podRoots), under the agent's own
// ROOTCA, and under the old root alone while the chain reaches it.
func checkAgentCert(t *testing.T, what string, s faultcheck.Sample, old *x509.Certificate, podRoots []*x509.Certificate) {
	t.Helper()
	if s.Cur.Leaf == nil {
		t.Errorf("%s: pilot-agent serves no certificate", what)
		return
	}
	if !time.Now().Before(s.Cur.Leaf.NotAfter) {
		t.Errorf("%s: pilot-agent serves %s, expired at %s", what, s.Cur.Serial(), s.Cur.Leaf.NotAfter.Format(time.TimeOnly))
	}
	trusts := map[string][]*x509.Certificate{"the meshagent pod's ROOTCA": podRoots, "pilot-agent's ROOTCA": s.Cur.Roots}
	for _, c := range s.Cur.Chain {
		if c.Equal(old) || c.CheckSignatureFrom(old) == nil { // an old-key leaf, the old root, or the cross certificate
			trusts["the old root alone"] = []*x509.Certificate{old}
		}
	}
	for name, roots := range trusts {
		if err := s.Cur.ChainsTo(roots, time.Now()); err != nil {
			t.Errorf("%s: Go: pilot-agent's %s (%d certificates) does not verify under %s: %v", what, s.Cur.Serial(), len(s.Cur.Chain), name, err)
		}
		if err := testkit.OpenSSLVerifies(t, s.Cur.Chain, roots); err != nil {
			t.Errorf("%s: pilot-agent's %s under %s: %v", what, s.Cur.Serial(), name, err)
		}
		// BoringSSL (Envoy's) has no verify command: a handshake with the chain and
		// key pilot-agent serves, its client trusting roots alone.
		if s.Cur.Key == nil {
			t.Errorf("%s: pilot-agent's %s: its key did not parse", what, s.Cur.Serial())
		} else if err := testkit.ToolAccepts(t, testkit.StackBoringSSL, s.Cur.Chain, s.Cur.Key, roots); err != nil {
			t.Errorf("%s: BoringSSL: pilot-agent's %s under %s: %v", what, s.Cur.Serial(), name, err)
		}
	}
	t.Logf("%s: pilot-agent serves %s (chain of %d, expires %s), verified in Go, OpenSSL and BoringSSL under %d trust stores",
		what, s.Cur.Serial(), len(s.Cur.Chain), s.Cur.Leaf.NotAfter.Format(time.TimeOnly), len(trusts))
}

// startStack runs `meshctl up` with short certificates until the test ends and
// returns its directory once its pod's Envoy stand-in is ready.
func startStack(ctx context.Context, t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "meshctl"), "up", "-dir", dir,
		"-dashboard-addr", "127.0.0.1:0", "-bin-dir", bin, "-ttl", rotationTTL.String(),
		// The check installs each phase and retires the old root (default: hourly).
		"-root-check-interval", "5s")
	cmd.Env = append(os.Environ(), "DEFAULT_WORKLOAD_CERT_TTL="+rotationTTL.String(), "MAX_WORKLOAD_CERT_TTL="+rotationMaxTTL.String())
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "envoy.ready") {
	}
	go func() { // keep draining meshctl's output
		for sc.Scan() {
		}
	}()
	if ctx.Err() != nil {
		t.Fatal("no envoy.ready from meshctl up")
	}
	return dir
}

// upStack is what the test reads of stack.json.
type upStack struct {
	NATSURL       string `json:"nats_url"`
	NATSAdminNKey string `json:"nats_admin_nkey"`
	Signer        struct {
		GRPCAddr   string `json:"grpc_addr"`
		ServerName string `json:"grpc_server_name"`
	} `json:"signer"`
	ControlPlane struct {
		XDSAddr string `json:"xds_addr"`
	} `json:"control_plane"`
	Pods []struct {
		ID             string `json:"id"`
		NodeID         string `json:"node_id"`
		Namespace      string `json:"namespace"`
		ServiceAccount string `json:"service_account"`
		TokenFile      string `json:"token_file"`
		SDSSocket      string `json:"sds_socket"`
	} `json:"pods"`
}

func readStack(t *testing.T, dir string) upStack {
	t.Helper()
	var st upStack
	data, err := os.ReadFile(filepath.Join(dir, "stack.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &st); err != nil || len(st.Pods) == 0 || st.Signer.GRPCAddr == "" || st.NATSAdminNKey == "" {
		t.Fatalf("stack.json: %v (no pod, no signer gRPC address or no admin credential)", err)
	}
	return st
}

// adminBus connects to the stack's bus as its admin (as meshctl rotate does).
func adminBus(ctx context.Context, t *testing.T, url, seed string) *nats.Conn {
	t.Helper()
	nc, err := bus.Connect(ctx, bus.Config{URL: url, NKeyFile: seed, Name: "rotation-test",
		InboxPrefix: policy.Inbox(policy.Admin, events.PodRef{}), ConnectWait: 2 * time.Second}, hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("connect as admin: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func bundleRoots(ctx context.Context, t *testing.T, nc *nats.Conn) []*x509.Certificate {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := faultcheck.Bundle(c, nc)
	if err != nil {
		t.Fatalf("trust bundle: %v", err)
	}
	roots, err := pki.ParseCertPEMs(b.Roots)
	if err != nil {
		t.Fatalf("trust bundle: %v", err)
	}
	return roots
}

// rotateNewKey rotates the root to a new key, as `meshctl rotate root -new-key`.
func rotateNewKey(ctx context.Context, t *testing.T, nc *nats.Conn) events.RotateReply {
	t.Helper()
	msg, err := events.NewMsg(events.SubjectRootRotate, "rotation-test", events.RotateRequest{NewKey: true, Reason: "pilot-agent rotation test"})
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := nc.RequestMsgWithContext(c, msg)
	if err != nil {
		t.Fatalf("rotate root: %v", err)
	}
	reply, _, err := events.Decode[events.RotateReply](resp)
	if err != nil || reply.Error != nil {
		t.Fatalf("rotate root: %v %v", err, reply.Error)
	}
	if p := reply.Plan; p == nil || p.NewRootLast.IsZero() || p.Settled.IsZero() || p.OldRootLeaves.IsZero() {
		t.Fatalf("rotate root -new-key: no plan of phases: %+v", reply.Plan)
	}
	return reply
}

// runningAgent is one pilot-agent process.
type runningAgent struct {
	cmd  *exec.Cmd
	said *tailLines
	stop func()
}

// startPilotAgent runs pilot-agent in work (its token and mounted root there) as a
// sidecar agent of the stack's signer and control plane, with the Envoy stand-in,
// until stop or the test's end, and returns once the stand-in is ready.
func startPilotAgent(ctx context.Context, t *testing.T, work, pa, bin string, st upStack) *runningAgent {
	t.Helper()
	pod := st.Pods[0]
	admin, status, dns := freePort(t), freePort(t), freePort(t)
	bootstrap := filepath.Join(work, "bootstrap.json")
	writeJSON(t, bootstrap, standinBootstrap(work, admin, pod.NodeID, pod.ID, pod.Namespace, pod.ServiceAccount))
	proxyConfig, _ := json.Marshal(map[string]any{
		"binaryPath": filepath.Join(bin, "envoy-standin"), "customConfigFile": bootstrap,
		"discoveryAddress": st.ControlPlane.XDSAddr, "controlPlaneAuthPolicy": "NONE",
		"proxyAdminPort": admin, "statusPort": status, "drainDuration": "1s", "terminationDrainDuration": "1s",
	})
	cmd := exec.CommandContext(ctx, pa, "proxy", "sidecar")
	cmd.Dir = work
	cmd.Env = append(os.Environ(),
		"PROXY_CONFIG="+string(proxyConfig),
		"CA_ADDR="+st.Signer.GRPCAddr, "ISTIOD_SAN="+st.Signer.ServerName,
		"POD_NAME="+pod.ID, "POD_NAMESPACE="+pod.Namespace, "SERVICE_ACCOUNT="+pod.ServiceAccount,
		"INSTANCE_IP=127.0.0.1", "TRUST_DOMAIN=cluster.local",
		"SECRET_TTL="+rotationTTL.String(),
		"ISTIO_META_DNS_CAPTURE=true", "DNS_PROXY_ADDR=127.0.0.1:"+strconv.Itoa(dns),
		// meshagent's debug tap off its fixed 15004: tests share the host's loopback.
		"PROXY_XDS_DEBUG_VIA_AGENT_PORT="+strconv.Itoa(freePort(t)),
		"ENVOY_SKIP_DEPRECATED_LOGS=false")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &runningAgent{cmd: cmd, said: &tailLines{}}
	stopped := false
	a.stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pilot-agent said:\n%s", a.said.String())
		}
		a.stop()
	})
	go a.said.read(out)
	ready := "http://127.0.0.1:" + strconv.Itoa(admin) + "/ready"
	if !testkit.Poll(time.Minute, func() bool { return standinLive(ready) }) {
		t.Fatalf("pilot-agent's stand-in never ready; pilot-agent said:\n%s", a.said.String())
	}
	return a
}
