package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A VM: no token, only a certificate provisioned once for its pod (meshctl sign
// -pod). Against the local stack, whose bus also speaks TLS and asks for client
// certificates: meshctl csr -bus renews with that certificate over the bus, and a
// claim to another pod is refused; the real sds-edge with PROV_CERT gets onto the
// bus with it, takes its identity there and keeps it: each certificate ends the bus
// user it admitted when it expires, so every reconnect (several here, long after
// the provisioned certificate expired) is admitted by the certificate current then.
// Restarted with PROV_CERT at its own OUTPUT_CERTS (Istio's VM layout), it comes
// back with the certificate it wrote before.
func TestVMKeepsItsIdentityOnTheBus(t *testing.T) {
	dir := testkit.ShortDir(t)
	r := startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	st := &r.Stack
	if st.NATSTLSCA == "" {
		t.Fatal("stack.json names no bus CA")
	}
	const byCert = `meshagent_signer_bus_callout_admitted_by_certificate_total`
	vm := testkit.ShortDir(t)
	prov := filepath.Join(vm, "etc", "prov")
	provChain, provKey := filepath.Join(prov, "cert-chain.pem"), filepath.Join(prov, "key.pem")
	if out, err := meshctl(t, "sign", "-dir", dir, "-ns", "default", "-sa", "demo", "-pod", "vm-1", "-ttl", "15s", "-out", prov); err != nil {
		t.Fatalf("provision: %v\n%s", err, out)
	}
	provisioned := serialIn(t, provChain)
	provExpires := time.Now().Add(15 * time.Second)

	renewed := t.TempDir()
	out, err := meshctl(t, "csr", "-dir", dir, "-bus", "-pod", "vm-1", "-cert", provChain, "-key", provKey, "-out", renewed)
	if err != nil || !strings.Contains(out, "admitted as pod vm-1 by its certificate") || !strings.Contains(out, "spiffe://cluster.local/ns/default/sa/demo") {
		t.Fatalf("csr -bus: %v\n%s", err, out)
	}
	if serialIn(t, filepath.Join(renewed, "cert-chain.pem")) == provisioned {
		t.Fatal("csr -bus wrote the certificate it was given")
	}
	// The new certificate admits the VM in turn.
	if out, err := meshctl(t, "csr", "-dir", dir, "-bus", "-pod", "vm-1", "-cert", filepath.Join(renewed, "cert-chain.pem"), "-key", filepath.Join(renewed, "key.pem")); err != nil {
		t.Fatalf("csr -bus with the renewed certificate: %v\n%s", err, out)
	}
	const mismatch = `meshagent_signer_bus_callout_refused_total{reason="pod_mismatch"}`
	refusedBefore := metric(t, st.Signer.HTTP, mismatch)
	if out, err := meshctl(t, "csr", "-dir", dir, "-bus", "-pod", "vm-2", "-cert", provChain, "-key", provKey); err == nil {
		t.Fatalf("vm-1's certificate admitted as vm-2:\n%s", out)
	}
	testkit.EventuallyWithin(t, 30*time.Second, "pod_mismatch counted", func() bool { return metric(t, st.Signer.HTTP, mismatch) >= refusedBefore+1 })

	output := filepath.Join(vm, "etc", "certs")
	if _, err := os.Stat(filepath.Join(vm, "var/run/secrets/tokens/istio-token")); err == nil {
		t.Fatal("the VM has a token")
	}
	admitted := metric(t, st.Signer.HTTP, byCert)
	stop := startVM(t, vm, st.NATSURL, st.NATSTLSCA, "etc/prov")
	// Served certificates, as OUTPUT_CERTS shows them: rotating over the bus until
	// well after the provisioned certificate expired, across reconnects.
	seen := map[string]bool{}
	testkit.EventuallyWithin(t, 90*time.Second, "the VM's certificates rotating over the bus across reconnects", func() bool {
		if s := serialIn(t, filepath.Join(output, "cert-chain.pem")); s != "" && s != provisioned {
			seen[s] = true
		}
		return len(seen) >= 5 && time.Now().After(provExpires.Add(8*time.Second)) && metric(t, st.Signer.HTTP, byCert) >= admitted+3
	})
	stop()

	// Restarted with its own OUTPUT_CERTS as PROV_CERT: back on the bus by the
	// certificate it wrote before, renewing over it.
	last := serialIn(t, filepath.Join(output, "cert-chain.pem"))
	admitted = metric(t, st.Signer.HTTP, byCert)
	startVM(t, vm, st.NATSURL, st.NATSTLSCA, "etc/certs")
	testkit.EventuallyWithin(t, 30*time.Second, "the restarted VM renewing by its own certificate", func() bool {
		s := serialIn(t, filepath.Join(output, "cert-chain.pem"))
		return s != "" && s != last && metric(t, st.Signer.HTTP, byCert) >= admitted+1
	})
}

// startVM runs the sds-edge binary as a VM's: no token under root, the bus over TLS,
// PROV_CERT prov and OUTPUT_CERTS etc/certs, 6 s certificates. It logs what the VM
// said when the test fails; stop ends it (also at cleanup).
func startVM(t *testing.T, root, natsURL, busCA, prov string) (stop func()) {
	t.Helper()
	httpAddr := testkit.FreeAddr(t)
	var logs testkit.Buffer
	cmd := exec.Command(filepath.Join(binDir, "sds-edge"), "-pod", "vm-1", "-pod-root", root, "-nats-url", natsURL, "-nats-tls-ca", busCA,
		"-namespace", "default", "-service-account", "demo", "-prov-cert", prov, "-output-certs", "etc/certs",
		"-secret-ttl", "6s", "-http-addr", httpAddr, "-log-level", "info")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if t.Failed() || strings.Contains(logs.String(), "Authorization Violation") {
				t.Errorf("sds-edge of the VM (PROV_CERT %s):\n%s", prov, logs.String())
			}
		})
	}
	t.Cleanup(stop)
	testkit.EventuallyWithin(t, 30*time.Second, "VM ready", func() bool {
		code, _ := testkit.HTTPGet("http://" + httpAddr + "/readyz")
		return code == http.StatusOK
	})
	return stop
}

// serialIn is the serial of the first certificate in a PEM file ("" while it is
// being replaced).
func serialIn(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	certs, err := pki.ParseCertsPEM(data)
	if err != nil || len(certs) == 0 {
		return ""
	}
	return pki.SerialHex(certs[0])
}
