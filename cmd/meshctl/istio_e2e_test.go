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
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/testkit"
)

// Issue 28, against real signers, a real secured bus and the real sds-edge binary:
// a pod started after its signer announced a federated bundle holds the foreign
// roots within a second of starting (read from the CA's history under the pod's
// own bus permissions), and meshctl sds prints ROOTCA_SPIFFE's trust domains.
func TestLatePodHoldsFederatedRootsAtOnce(t *testing.T) {
	eastDir, westDir := testkit.ShortDir(t), testkit.ShortDir(t)
	east := startStack(t, devstack.Config{Dir: eastDir, Pods: 0, LeafTTL: time.Hour, BundleEndpointAddr: "127.0.0.1:0"})
	west := startStack(t, devstack.Config{Dir: westDir, Pods: 0, LeafTTL: time.Hour, TrustDomain: "west.example",
		Federate: "cluster.local|" + east.Stack.Signer.BundleEndpoint, FederateCA: east.Stack.Signer.BundleEndpointCA})
	testkit.EventuallyWithin(t, 30*time.Second, "west follows cluster.local", func() bool {
		out, err := meshctl(t, "trust", "-dir", westDir)
		return err == nil && strings.Contains(out, "cluster.local") && strings.Contains(out, "federated")
	})

	root := testkit.ShortDir(t)
	iss, err := devtoken.Load(filepath.Join(westDir, "issuer"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := iss.MintForPod("default", "late", "late-0", west.Stack.TokenIssuer.Audience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokPath := filepath.Join(root, "var/run/secrets/tokens/istio-token")
	if err := os.MkdirAll(filepath.Dir(tokPath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokPath, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := testkit.FreeAddr(t)
	socket := filepath.Join(root, "sds.sock")
	var logs testkit.Buffer
	cmd := exec.Command(filepath.Join(binDir, "sds-edge"), "-pod", "late-0", "-pod-root", root, "-nats-url", west.Stack.NATSURL,
		"-namespace", "default", "-service-account", "late", "-trust-domain", "west.example", "-socket", socket,
		"-http-addr", httpAddr, "-log-level", "info")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("the late pod's sds-edge:\n%s", logs.String())
			}
		})
	}
	t.Cleanup(stop)
	var out string
	var held time.Duration
	testkit.EventuallyWithin(t, 10*time.Second, "the late pod serves cluster.local in ROOTCA_SPIFFE", func() bool {
		if code, _ := testkit.HTTPGet("http://" + httpAddr + "/readyz"); code != http.StatusOK {
			return false
		}
		out, _ = meshctl(t, "sds", "-socket", socket, "ROOTCA_SPIFFE")
		held = time.Since(start)
		return strings.Contains(out, "ROOTCA_SPIFFE trust domain cluster.local root")
	})
	t.Logf("foreign roots held %s after exec", held)
	if held > time.Second {
		t.Errorf("the foreign roots came %s after the pod started, want within a second", held)
	}
	if !strings.Contains(out, "ROOTCA_SPIFFE trust domain west.example root") {
		t.Errorf("ROOTCA_SPIFFE lacks the pod's own domain:\n%s", out)
	}
	if strings.Contains(logs.String(), "Permissions Violation") {
		t.Errorf("the pod hit a permission violation:\n%s", logs.String())
	}
}
