package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
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
	testkit.Launch(t, cmd, p.logs, "sds-edge of "+pod)
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

// ISTIO_META_CERT_SIGNER against the real signer and the real sds-edge binary
// (issue 28): the named signer's chain ends at its own CA's root, outside the
// mesh's, and the pod takes it because the signer vouches for that root with the
// mesh CA's key: it serves the chain and the partner's root beside the mesh's, on
// the bus and over Istio's gRPC API (CA_ADDR, the signer name in the request's
// metadata as Istio's agent sends it). Nothing is refused.
func TestNamedSignerChainServedFromARealSigner(t *testing.T) {
	dir := testkit.ShortDir(t)
	st := startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	partner := readCerts(t, filepath.Join(dir, "secrets", "signers", devstack.PartnerSigner, "root-cert.pem"))
	mesh := readCerts(t, st.Stack.TrustBundle)
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"bus", nil},
		{"grpc", []string{"CA_ADDR=" + st.Stack.Signer.GRPCAddr, "CA_ROOT_CERT=" + st.Stack.TrustBundle}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startPodEdge(t, dir, st, "partner-"+tc.name, "demo", "cluster.local",
				append([]string{"ISTIO_META_CERT_SIGNER=" + devstack.PartnerSigner}, tc.env...))
			chain := waitChain(t, p)
			if !chain[len(chain)-1].Equal(partner[0]) {
				t.Fatalf("the pod's chain ends at %s, want the partner signer's root", chain[len(chain)-1].Subject)
			}
			testkit.EventuallyWithin(t, 10*time.Second, "the pod ready", func() bool {
				code, _ := testkit.HTTPGet("http://" + p.http + "/readyz")
				return code == http.StatusOK
			})
			out, err := meshctl(t, "sds", "-socket", p.socket, "default", "ROOTCA")
			if err != nil {
				t.Fatalf("meshctl sds: %v\n%s", err, out)
			}
			for _, want := range []string{"spiffe://cluster.local/ns/default/sa/demo", pki.Fingerprint(partner[0])[:16], pki.Fingerprint(mesh[0])[:16]} {
				if !strings.Contains(out, want) {
					t.Errorf("meshctl sds lacks %s:\n%s", want, out)
				}
			}
			roots := readCerts(t, filepath.Join(p.root, "certs", "root-cert.pem"))
			if !slices.ContainsFunc(roots, partner[0].Equal) || !slices.ContainsFunc(roots, mesh[0].Equal) {
				t.Errorf("root-cert.pem holds %d roots, want the mesh's and the partner's", len(roots))
			}
			if n := metric(t, p.http, `meshagent_sds_edge_trust_rejected_total{source="sign-reply"}`); n != 0 {
				t.Errorf("%v sign replies refused:\n%s", n, p.logs.String())
			}
			// Envoy's BoringSSL and OpenSSL take the chain the pod serves, with its
			// key, to the partner's root and to the roots the pod serves in ROOTCA,
			// and not to the mesh's root alone.
			keyPEM, err := os.ReadFile(filepath.Join(p.root, "certs", "key.pem"))
			if err != nil {
				t.Fatal(err)
			}
			key, err := pki.ParseKeyPEM(keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			for _, stack := range []string{testkit.StackOpenSSL, testkit.StackBoringSSL} {
				for _, trust := range []struct {
					name  string
					roots []*x509.Certificate
				}{{"the partner's root", partner[:1]}, {"the pod's root-cert.pem", roots}} {
					if err := testkit.ToolAccepts(t, stack, chain, key, trust.roots); err != nil {
						t.Errorf("%s trusting %s: %v", stack, trust.name, err)
					}
				}
				if err := testkit.ToolAccepts(t, stack, chain, key, mesh[:1]); err == nil {
					t.Errorf("%s accepted the partner's chain trusting the mesh root alone", stack)
				}
			}
		})
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

// TestIstioInjectedPodAgainstAFullStack (issue 28): one `meshagent pod` process,
// its three roles configured by exactly the env and args Istio's injection
// template gives a sidecar (cmd/meshagent's fixture; only the pod root, listen
// addresses, the bus and the CA's address and root are the test's, and the
// Envoy stand-in for Envoy), against a full local stack (signer and rotator on an
// embedded NATS, the demo control plane). It gets its certificate over Istio's
// gRPC API as the template intends: a P-384 key (ECC_* in PROXY_CONFIG's
// proxyMetadata), from the named signer partner (ISTIO_META_CERT_SIGNER), whose
// root the mesh CA endorses; it serves the certificate and both roots on SDS, its
// status port turns ready with Envoy started, and Envoy's bootstrap carries the
// template's ISTIO_META_* as node metadata.
func TestIstioInjectedPodAgainstAFullStack(t *testing.T) {
	meshagent := testkit.Binary(t, "meshagent")
	var fixture map[string]json.RawMessage
	var in struct {
		Args []string          `json:"args"`
		Env  map[string]string `json:"env"`
	}
	data, err := os.ReadFile("../meshagent/testdata/istio-injected.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &fixture); err != nil || json.Unmarshal(fixture["sidecar"], &in) != nil {
		t.Fatalf("the fixture: %v", err)
	}
	dir := testkit.ShortDir(t)
	st := startStack(t, devstack.Config{Dir: dir, Pods: 0, LeafTTL: time.Hour})
	partner := readCerts(t, filepath.Join(dir, "secrets", "signers", devstack.PartnerSigner, "root-cert.pem"))
	mesh := readCerts(t, st.Stack.TrustBundle)

	root := testkit.ShortDir(t)
	iss, err := devtoken.Load(filepath.Join(dir, "issuer"))
	if err != nil {
		t.Fatal(err)
	}
	ns, sa, pod := in.Env["POD_NAMESPACE"], in.Env["SERVICE_ACCOUNT"], in.Env["POD_NAME"]
	tok, err := iss.MintForPod(ns, sa, pod, st.Stack.TokenIssuer.Audience, time.Hour, time.Now())
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
	sdsHTTP, relayHTTP, status := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	args := slices.Concat([]string{"pod",
		"--sds-edge", "-http-addr", sdsHTTP,
		"--xds-relay", "-http-addr", relayHTTP, "-dns-addr", testkit.FreeAddr(t), "-debug-tap=false",
		"-discovery-address", st.Stack.ControlPlane.XDSAddr, "-xds-tls", "plaintext",
		"--launcher"}, in.Args, []string{"-status-addr", status, "-envoy-admin", testkit.FreeAddr(t),
		"-envoy-stats-addr", testkit.FreeAddr(t), "-relay-ready-url", "http://" + relayHTTP + "/readyz",
		"-sds-ready-url", "http://" + sdsHTTP + "/readyz", "-envoy-binary", filepath.Join(binDir, "envoy-standin")})
	cmd := exec.Command(meshagent, args...)
	cmd.Env = os.Environ()
	for k, v := range in.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "POD_ROOT="+root, "NATS_URL="+st.Stack.NATSURL,
		"CA_ADDR="+st.Stack.Signer.GRPCAddr, "CA_ROOT_CERT="+st.Stack.TrustBundle)
	logs := &testkit.Buffer{}
	testkit.Launch(t, cmd, logs, "meshagent pod")

	testkit.EventuallyWithin(t, 30*time.Second, "the pod's status port ready (Envoy started on its certificate)", func() bool {
		code, _ := testkit.HTTPGet("http://" + status + "/healthz/ready")
		return code == http.StatusOK
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := sdsclient.DialUnix(ctx, filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	got, err := sdsclient.Fetch(ctx, cc, "sidecar~10.244.1.17~"+pod+"."+ns+"~"+ns+".svc.cluster.local", "default", "ROOTCA")
	if err != nil {
		t.Fatalf("SDS: %v", err)
	}
	chain, err := pki.ParseCertsPEM(got["default"].CertChain)
	if err != nil || len(chain) < 2 {
		t.Fatalf("default: %v (%d certificates)", err, len(chain))
	}
	if id := chain[0].URIs; len(id) != 1 || id[0].String() != "spiffe://cluster.local/ns/"+ns+"/sa/"+sa {
		t.Errorf("served identity %v", id)
	}
	if alg, _ := pki.AlgOf(chain[0].PublicKey); alg != pki.ECP384 {
		t.Errorf("served key %s, want EC-P384 (ECC_CURVE in proxyMetadata)", alg)
	}
	if !chain[len(chain)-1].Equal(partner[0]) {
		t.Errorf("served chain ends at %s, want the partner signer's root (ISTIO_META_CERT_SIGNER)", chain[len(chain)-1].Subject)
	}
	roots, _ := pki.ParseCertsPEM(got["ROOTCA"].TrustedCA)
	if !slices.ContainsFunc(roots, partner[0].Equal) || !slices.ContainsFunc(roots, mesh[0].Equal) {
		t.Errorf("ROOTCA holds %d roots, want the mesh's and the partner's", len(roots))
	}
	var boot struct {
		Node struct {
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/istio/proxy/envoy-rev.json")); err != nil || json.Unmarshal(b, &boot) != nil {
		t.Fatalf("Envoy's bootstrap: %v", err)
	}
	for _, k := range []string{"POD_PORTS", "APP_CONTAINERS", "INTERCEPTION_MODE", "WORKLOAD_NAME", "OWNER", "CERT_SIGNER", "DNS_CAPTURE"} {
		if v := boot.Node.Metadata[k]; v != in.Env["ISTIO_META_"+k] {
			t.Errorf("bootstrap node metadata %s = %v, want %q", k, v, in.Env["ISTIO_META_"+k])
		}
	}
}
