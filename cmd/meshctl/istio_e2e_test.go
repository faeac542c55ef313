package main

import (
	"crypto/x509"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/pki"
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

	start := time.Now()
	p := startPodEdge(t, westDir, west, "late-0", "late", "west.example", nil)
	var out string
	var held time.Duration
	testkit.EventuallyWithin(t, 10*time.Second, "the late pod serves cluster.local in ROOTCA_SPIFFE", func() bool {
		if code, _ := testkit.HTTPGet("http://" + p.http + "/readyz"); code != http.StatusOK {
			return false
		}
		out, _ = meshctl(t, "sds", "-socket", p.socket, "ROOTCA_SPIFFE")
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
	if strings.Contains(p.logs.String(), "Permissions Violation") {
		t.Errorf("the pod hit a permission violation:\n%s", p.logs.String())
	}
}

// edgeProc is an sds-edge binary run as a pod of a local stack.
type edgeProc struct {
	root, socket, http string
	logs               *testkit.Buffer
}

// startPodEdge runs the sds-edge binary as pod default/<pod> of the stack in dir,
// with a token of service account sa minted by the stack's issuer and env added
// to the process environment; it is stopped at cleanup (logged if the test failed).
func startPodEdge(t *testing.T, dir string, st *devstack.Runner, pod, sa, td string, env []string) edgeProc {
	t.Helper()
	root := testkit.ShortDir(t)
	iss, err := devtoken.Load(filepath.Join(dir, "issuer"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := iss.MintForPod("default", sa, pod, st.Stack.TokenIssuer.Audience, time.Hour, time.Now())
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
	p := edgeProc{root: root, socket: filepath.Join(root, "sds.sock"), http: testkit.FreeAddr(t), logs: &testkit.Buffer{}}
	cmd := exec.Command(filepath.Join(binDir, "sds-edge"), "-pod", pod, "-pod-root", root, "-nats-url", st.Stack.NATSURL,
		"-namespace", "default", "-service-account", sa, "-trust-domain", td, "-socket", p.socket,
		"-http-addr", p.http, "-log-level", "info", "-output-certs", "certs")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sds-edge of %s:\n%s", pod, p.logs.String())
		}
	})
	return p
}

// Istio's key env against a real signer: ECC_SIGNATURE_ALGORITHM and ECC_CURVE
// give the pod a P-384 key, certified by the mesh's CA.
func TestIstioKeyEnvAgainstARealSigner(t *testing.T) {
	dir := testkit.ShortDir(t)
	st := startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	p := startPodEdge(t, dir, st, "istio-0", "demo", "cluster.local", []string{"ECC_SIGNATURE_ALGORITHM=ECDSA", "ECC_CURVE=P384"})
	chain := waitChain(t, p)
	if alg, _ := pki.AlgOf(chain[0].PublicKey); alg != pki.ECP384 {
		t.Errorf("the pod's key is %s, want EC-P384", alg)
	}
	if len(chain[0].URIs) != 1 || chain[0].URIs[0].String() != "spiffe://cluster.local/ns/default/sa/demo" {
		t.Errorf("the pod's identity %v", chain[0].URIs)
	}
}

// ISTIO_META_CERT_SIGNER reaches the real signer, and the named signer's chain,
// which ends at its own CA rather than under the mesh's roots, is refused by the
// pod: a leaf must chain to a root the pod trusts (docs/istio.md: the named
// signer's root is not yet endorsed to pods). Nothing is served or written.
func TestNamedSignerOutsideTheMeshRootsIsRefused(t *testing.T) {
	dir := testkit.ShortDir(t)
	st := startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	p := startPodEdge(t, dir, st, "partner-0", "demo", "cluster.local", []string{"ISTIO_META_CERT_SIGNER=" + devstack.PartnerSigner})
	const rejected = `meshagent_sds_edge_trust_rejected_total{source="sign-reply"}`
	testkit.EventuallyWithin(t, 10*time.Second, "sds-edge serving /healthz", func() bool {
		code, _ := testkit.HTTPGet("http://" + p.http + "/healthz")
		return code == http.StatusOK
	})
	testkit.EventuallyWithin(t, 15*time.Second, "the named signer's chain refused", func() bool {
		return metric(t, p.http, rejected) >= 2 && strings.Contains(p.logs.String(), "chain does not verify to a trusted root")
	})
	if _, err := os.Stat(filepath.Join(p.root, "certs", "cert-chain.pem")); err == nil {
		t.Fatal("a certificate of the refused chain was written")
	}
	if code, _ := testkit.HTTPGet("http://" + p.http + "/readyz"); code == http.StatusOK {
		t.Fatal("the pod is ready with a refused chain")
	}
}

// waitChain waits for the pod's OUTPUT_CERTS chain and returns it.
func waitChain(t *testing.T, p edgeProc) []*x509.Certificate {
	t.Helper()
	var chain []*x509.Certificate
	testkit.EventuallyWithin(t, 15*time.Second, "the pod's certificate written", func() bool {
		data, err := os.ReadFile(filepath.Join(p.root, "certs", "cert-chain.pem"))
		if err != nil {
			return false
		}
		chain, err = pki.ParseCertsPEM(data)
		return err == nil && len(chain) > 0
	})
	return chain
}
