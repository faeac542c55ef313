package main

import (
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// The rest of istiod's CA from the command line, against the local stack as make
// run starts it (README): the trusted node agent asks for the identity of a demo pod
// on its node and gets it, and every other ask is refused by name; a named signer's
// chain ends at its own CA, not the mesh's root.
func TestNodeAgentAndNamedSignerFromTheCommandLine(t *testing.T) {
	dir := testkit.ShortDir(t)
	r := startStack(t, devstack.Config{Dir: dir, Pods: 1, LeafTTL: time.Hour})
	if got := r.Stack.Signer.TrustedNodeAccounts; len(got) != 1 || got[0] != "istio-system/ztunnel" || r.Stack.Signer.NodeAPI == "" {
		t.Fatalf("stack.json: trusted node accounts %v, node api %q", got, r.Stack.Signer.NodeAPI)
	}
	const demo = "spiffe://cluster.local/ns/default/sa/demo"
	agent := []string{"csr", "-dir", dir, "-ns", devstack.NodeAgentNamespace, "-sa", devstack.NodeAgentServiceAccount}

	out, err := meshctl(t, append(agent, "-pod", devstack.NodeAgentPod, "-impersonate", demo)...)
	if err != nil || !strings.Contains(out, "identity   "+demo+"\n") {
		t.Fatalf("node agent for a pod on its node: %v\n%s", err, out)
	}
	refused := func(what, want string, args ...string) {
		t.Helper()
		out, err := meshctl(t, args...)
		if err == nil || !strings.Contains(err.Error()+out, want) {
			t.Fatalf("%s: got %v\n%s\nwant a refusal naming %q", what, err, out, want)
		}
	}
	refused("a node agent's token bound to no pod", "pod-bound token", append(agent, "-impersonate", demo)...)
	refused("a service account with no pod on the node", "no running pod of service account default/web",
		append(agent, "-pod", devstack.NodeAgentPod, "-impersonate", "spiffe://cluster.local/ns/default/sa/web")...)
	refused("a node agent pod the API does not know", "not found",
		append(agent, "-pod", "ztunnel-9", "-impersonate", demo)...)
	refused("a workload that is not a node agent", "not a trusted node account",
		"csr", "-dir", dir, "-ns", "default", "-sa", "demo", "-pod", "demo-0", "-impersonate", "spiffe://cluster.local/ns/default/sa/other")

	certs := t.TempDir()
	if out, err := meshctl(t, "csr", "-dir", dir, "-ns", "default", "-sa", "web", "-signer", devstack.PartnerSigner, "-out", certs); err != nil {
		t.Fatalf("named signer: %v\n%s", err, out)
	}
	chain := readCerts(t, filepath.Join(certs, "cert-chain.pem"))
	partnerDir := filepath.Join(dir, "secrets", "signers", devstack.PartnerSigner)
	partner := readCerts(t, filepath.Join(partnerDir, "root-cert.pem"))
	mesh := readCerts(t, r.Stack.TrustBundle)
	verifies := func(roots []*x509.Certificate) bool {
		pool, inter := x509.NewCertPool(), x509.NewCertPool()
		for _, c := range roots {
			pool.AddCert(c)
		}
		for _, c := range chain[1:] {
			inter.AddCert(c)
		}
		_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err == nil
	}
	if !verifies(partner) || verifies(mesh) {
		t.Fatalf("named signer's chain: verifies under the partner CA %v, under the mesh's roots %v; want only the partner's",
			verifies(partner), verifies(mesh))
	}
	if got := chain[0].URIs; len(got) != 1 || got[0].String() != "spiffe://cluster.local/ns/default/sa/web" {
		t.Fatalf("named signer issued %v", got)
	}
	if fi, err := os.Stat(filepath.Join(partnerDir, "ca-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("partner CA key: %v (mode %v), want 0600", err, fi.Mode().Perm())
	}
	refused("a signer not configured", `unknown cert signer "nope"`, "csr", "-dir", dir, "-ns", "default", "-sa", "web", "-signer", "nope")
}

func readCerts(t *testing.T, path string) []*x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCertsPEM(b)
	if err != nil || len(certs) == 0 {
		t.Fatalf("%s: %v (%d certificates)", path, err, len(certs))
	}
	return certs
}

// Federation from the command line: a second local stack in another trust domain
// follows the first one's bundle endpoint (meshctl up -federate, as the README
// shows), and meshctl trust lists the first domain as federated, with its root.
func TestSecondStackFederatesFromTheCommandLine(t *testing.T) {
	eastDir, westDir := testkit.ShortDir(t), testkit.ShortDir(t)
	east := startStack(t, devstack.Config{Dir: eastDir, Pods: 0, LeafTTL: time.Hour, BundleEndpointAddr: "127.0.0.1:0"})
	if east.Stack.Signer.BundleEndpoint == "" || east.Stack.Signer.BundleEndpointCA == "" {
		t.Fatalf("stack.json names no bundle endpoint: %+v", east.Stack.Signer)
	}
	startStack(t, devstack.Config{Dir: westDir, Pods: 0, LeafTTL: time.Hour, TrustDomain: "west.example",
		Federate: "cluster.local|" + east.Stack.Signer.BundleEndpoint, FederateCA: east.Stack.Signer.BundleEndpointCA})
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last meshctl trust -o json:\n%s", last)
		}
	}()
	testkit.EventuallyWithin(t, 30*time.Second, "west lists cluster.local as federated", func() bool {
		out, err := meshctl(t, "trust", "-dir", westDir, "-o", "json")
		last = out
		var rows []struct {
			TrustDomain string `json:"trust_domain"`
			Kind        string `json:"kind"`
			Source      string `json:"source"`
			Roots       int    `json:"roots"`
		}
		if err != nil || json.Unmarshal([]byte(out), &rows) != nil {
			return false
		}
		for _, r := range rows {
			if r.TrustDomain == "cluster.local" && r.Kind == "federated" && r.Roots == 1 && strings.Contains(r.Source, east.Stack.Signer.BundleEndpoint) {
				return true
			}
		}
		return false
	})
	if human, err := meshctl(t, "trust", "-dir", westDir); err != nil || !strings.Contains(human, "cluster.local") || !strings.Contains(human, "west.example") {
		t.Fatalf("meshctl trust: %v\n%s", err, human)
	}
}
