//go:build istio

package main

// Against Istio's real istiod (tests/istiotest, make test-istio): meshagent's pod
// agent with istiod as its CA. The API server is real (tests/kubetest), and so is
// every token: a TokenRequest token of audience istio-ca, bound to a Pod object,
// which istiod checks by TokenReview.

import (
	"context"
	"crypto/x509"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/istiotest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// istiodPod is a pod's root laid out as a kubelet lays out an Istio sidecar's:
// the projected istio-ca token and istiod's istio-ca-root-cert ConfigMap mounted
// at ./var/run/secrets/istio/root-cert.pem (rootPEM "": not mounted).
func istiodPod(t *testing.T, token, rootPEM string) string {
	t.Helper()
	root := testkit.ShortDir(t)
	for path, data := range map[string]string{"var/run/secrets/tokens/istio-token": token, "var/run/secrets/istio/root-cert.pem": rootPEM} {
		if data == "" {
			continue // nothing mounted there
		}
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// startIstiodEdge runs the sds-edge binary for pod ns/pod (service account sa)
// in root, with CA_ADDR istiod's 15012 and no bus (its address has nothing
// listening), env added; stopped at cleanup.
func startIstiodEdge(t *testing.T, d *istiotest.Istiod, root, ns, pod, sa string, env ...string) edgeProc {
	t.Helper()
	p := edgeProc{root: root, socket: filepath.Join(root, "sds.sock"), http: testkit.FreeAddr(t), logs: &testkit.Buffer{}}
	cmd := exec.Command(filepath.Join(binDir, "sds-edge"), "-pod", pod, "-pod-root", root, "-nats-url", "nats://"+testkit.FreeAddr(t),
		"-namespace", ns, "-service-account", sa, "-trust-domain", "cluster.local", "-socket", p.socket,
		"-http-addr", p.http, "-log-level", "debug", "-output-certs", "certs")
	cmd.Env = append(os.Environ(), append([]string{"CA_ADDR=" + d.SecureAddr}, env...)...)
	testkit.Launch(t, cmd, p.logs, "sds-edge of "+ns+"/"+pod)
	return p
}

// sdsServed fetches default and ROOTCA from the pod's SDS socket.
func sdsServed(t *testing.T, p edgeProc) (chain []*x509.Certificate, keyPEM []byte, roots []*x509.Certificate) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := sdsclient.DialUnix(ctx, p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	got, err := sdsclient.Fetch(ctx, cc, "sidecar~10.244.1.17~web-0.shop~shop.svc.cluster.local", "default", "ROOTCA")
	if err != nil {
		t.Fatalf("SDS: %v", err)
	}
	if chain, err = pki.ParseCertsPEM(got["default"].CertChain); err != nil {
		t.Fatalf("SDS default: %v", err)
	}
	if roots, err = pki.ParseCertsPEM(got["ROOTCA"].TrustedCA); err != nil {
		t.Fatalf("SDS ROOTCA: %v", err)
	}
	return chain, got["default"].PrivateKey, roots
}

// TestIstiodIssuesThePodsCertificate: sds-edge with CA_ADDR = istiod's 15012,
// the pod's token a TokenRequest token (audience istio-ca) bound to its Pod, and
// istiod's root as the kubelet mounts it, gets its certificate from istiod and
// serves it on SDS: the pod's SPIFFE identity, chained to istiod's root (which
// ROOTCA serves), accepted by OpenSSL and BoringSSL trusting that root and refused
// by both trusting another. With a 30 s TTL (the request's, which istiod honours
// below MAX_WORKLOAD_CERT_TTL) it renews by itself, and the new certificate is
// accepted the same way. istiod's own counters record each issuance. Then what
// istiod refuses (refusals) and CA_ROOT_CA as Istio's agent reads it.
func TestIstiodIssuesThePodsCertificate(t *testing.T) {
	kube := kubetest.Start(t)
	d := istiotest.Start(t, kube, istiotest.Config{Env: []string{"MAX_WORKLOAD_CERT_TTL=1h"}})
	kube.Admin.Namespace(t, "shop", nil)
	kube.Admin.ServiceAccount(t, "shop", "web")
	rootPEM, istioRoots := d.RootCert(t, "shop")
	uid := istiotest.Pod(t, kube, "shop", "web-0", "web", "10.244.1.17", map[string]string{"app": "web"})
	tok := kube.Admin.RequestToken(t, "shop", "web", "istio-ca", "web-0", uid, 3600)
	before := d.Counter(t, "citadel_server_success_cert_issuance_count")

	p := startIstiodEdge(t, d, istiodPod(t, tok, rootPEM), "shop", "web-0", "web", "SECRET_TTL=30s")
	testkit.EventuallyWithin(t, 60*time.Second, "the pod ready with istiod's certificate", func() bool {
		code, _ := testkit.HTTPGet("http://" + p.http + "/readyz")
		return code == http.StatusOK
	})
	chain, keyPEM, roots := sdsServed(t, p)
	checkIstiodChain(t, chain, keyPEM, istioRoots)
	if len(roots) != 1 || !roots[0].Equal(istioRoots[0]) {
		t.Errorf("ROOTCA serves %d roots, want istiod's root alone", len(roots))
	}
	// istiod backdates NotBefore by two minutes (ClockSkewGracePeriod); NotAfter is
	// the request's 30 s from the signing.
	if life := chain[0].NotAfter.Sub(chain[0].NotBefore); life < 2*time.Minute+25*time.Second || life > 2*time.Minute+35*time.Second {
		t.Errorf("lifetime %s, want the 30 s asked for plus istiod's 2 min backdating", life)
	}
	if n := d.Counter(t, "citadel_server_success_cert_issuance_count"); n <= before {
		t.Errorf("istiod counted %v issuances, %v before the pod", n, before)
	}

	// Renewal: a new certificate before the first expires, from istiod again.
	first := chain[0]
	var renewed []*x509.Certificate
	testkit.EventuallyWithin(t, 40*time.Second, "the pod's certificate renewed by istiod", func() bool {
		renewed, keyPEM, _ = sdsServed(t, p)
		return !renewed[0].Equal(first)
	})
	if !renewed[0].NotAfter.After(first.NotAfter) || time.Now().After(first.NotAfter) {
		t.Errorf("renewed at %s for a certificate expiring %s (new NotAfter %s)", time.Now().Format(time.RFC3339), first.NotAfter, renewed[0].NotAfter)
	}
	// Renewed about 80 % into the 30 s asked for (sds-edge's safety ratio, counted
	// from the reply), not at once for a lifetime measured from the backdated NotBefore.
	if gap := renewed[0].NotBefore.Sub(first.NotBefore); gap < 15*time.Second {
		t.Errorf("renewed %s after the first issuance, want about 24 s (80 %% of 30 s)", gap)
	}
	checkIstiodChain(t, renewed, keyPEM, istioRoots)
	if n := d.Counter(t, "citadel_server_success_cert_issuance_count"); n < before+2 {
		t.Errorf("istiod counted %v issuances, want at least two more than %v", n, before)
	}
	if strings.Count(p.logs.String(), "safety-deadline") > 3 {
		t.Errorf("sds-edge renewed more often than the lifetime says:\n%s", p.logs.String())
	}
	t.Run("refusals", func(t *testing.T) { istiodRefuses(t, d, kube, rootPEM) })
	t.Run("CA_ROOT_CA", func(t *testing.T) { caRootCA(t, d, kube, rootPEM, istioRoots) })
}

// caRootCA: Istio's CA_ROOT_CA against istiod. A file holding istiod's root,
// with nothing mounted at ./var/run/secrets/istio/root-cert.pem, is what
// verifies istiod's TLS: the pod gets its certificate. SYSTEM, the host's trust
// store, does not hold istiod's self-signed root: the pod's TLS handshake with
// istiod fails (though the mounted root is there) and it has no certificate.
func caRootCA(t *testing.T, d *istiotest.Istiod, kube *kubetest.Server, rootPEM string, istioRoots []*x509.Certificate) {
	file := filepath.Join(t.TempDir(), "istiod-root.pem")
	if err := os.WriteFile(file, []byte(rootPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	token := func(pod string) string {
		uid := istiotest.Pod(t, kube, "shop", pod, "web", "10.244.1.21", map[string]string{"app": "web"})
		return kube.Admin.RequestToken(t, "shop", "web", "istio-ca", pod, uid, 3600)
	}
	p := startIstiodEdge(t, d, istiodPod(t, token("web-file"), ""), "shop", "web-file", "web", "CA_ROOT_CA="+file, "SECRET_TTL=30m")
	testkit.EventuallyWithin(t, 60*time.Second, "the pod ready with CA_ROOT_CA a file", func() bool {
		code, _ := testkit.HTTPGet("http://" + p.http + "/readyz")
		return code == http.StatusOK
	})
	chain, keyPEM, _ := sdsServed(t, p)
	checkIstiodChain(t, chain, keyPEM, istioRoots)

	p = startIstiodEdge(t, d, istiodPod(t, token("web-system"), rootPEM), "shop", "web-system", "web", "CA_ROOT_CA=SYSTEM", "SECRET_TTL=30m")
	testkit.EventuallyWithin(t, 60*time.Second, "sds-edge refusing istiod's certificate under the host's roots", func() bool {
		return strings.Contains(p.logs.String(), "x509: certificate signed by unknown authority")
	})
	t.Logf("sds-edge: %s", istiotest.LogLine(p.logs.String(), "x509: certificate signed by unknown authority"))
	if code, _ := testkit.HTTPGet("http://" + p.http + "/readyz"); code == http.StatusOK {
		t.Error("the pod is ready with CA_ROOT_CA=SYSTEM")
	}
	if _, err := os.Stat(filepath.Join(p.root, "certs", "cert-chain.pem")); err == nil {
		t.Error("the pod wrote a certificate with CA_ROOT_CA=SYSTEM")
	}
}

// istiodRefuses: what istiod must refuse, it refuses, and the pod then has no
// certificate: a token for another audience, a token bound to a pod that was
// deleted (both fail istiod's TokenReview: citadel_server_authentication_failure_count),
// and a TTL above MAX_WORKLOAD_CERT_TTL (citadel_server_csr_sign_err_count).
func istiodRefuses(t *testing.T, d *istiotest.Istiod, kube *kubetest.Server, rootPEM string) {
	for _, tc := range []struct {
		name, pod, audience, counter string
		said                         string // in istiod's log
		deletePod                    bool
		env                          []string
	}{
		{name: "another audience", pod: "web-aud", audience: "not-istio-ca", counter: "citadel_server_authentication_failure_count",
			said: `token audiences ["not-istio-ca"] is invalid for the target audiences ["istio-ca"]`},
		{name: "pod deleted", pod: "web-gone", audience: "istio-ca", deletePod: true, counter: "citadel_server_authentication_failure_count",
			said: "service account token has been invalidated"},
		{name: "ttl above the maximum", pod: "web-ttl", audience: "istio-ca", env: []string{"SECRET_TTL=2h"}, counter: "citadel_server_csr_sign_err_count",
			said: "requested TTL 2h0m0s is greater than the max allowed TTL 1h0m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := istiotest.Pod(t, kube, "shop", tc.pod, "web", "10.244.1.20", map[string]string{"app": "web"})
			tok := kube.Admin.RequestToken(t, "shop", "web", tc.audience, tc.pod, uid, 3600)
			if tc.deletePod {
				kube.Admin.DeletePod(t, "shop", tc.pod)
			}
			before := d.Counter(t, tc.counter)
			p := startIstiodEdge(t, d, istiodPod(t, tok, rootPEM), "shop", tc.pod, "web", tc.env...)
			testkit.EventuallyWithin(t, 60*time.Second, "istiod refusing the pod ("+tc.counter+")", func() bool {
				return d.Counter(t, tc.counter) > before && strings.Contains(d.Logs.String(), tc.said)
			})
			t.Logf("%s", istiotest.LogLine(d.Logs.String(), tc.said))
			if code, _ := testkit.HTTPGet("http://" + p.http + "/readyz"); code == http.StatusOK {
				t.Errorf("the pod is ready after istiod refused it")
			}
			if _, err := os.Stat(filepath.Join(p.root, "certs", "cert-chain.pem")); err == nil {
				t.Errorf("the pod wrote a certificate after istiod refused it")
			}
		})
	}
}

// checkIstiodChain checks a chain istiod issued to shop/web: the identity, the
// chain to istiod's root in Go, and the handshake in OpenSSL and BoringSSL
// trusting istiod's root, and not trusting another root.
func checkIstiodChain(t *testing.T, chain []*x509.Certificate, keyPEM []byte, istioRoots []*x509.Certificate) {
	t.Helper()
	if len(chain) < 2 {
		t.Fatalf("chain of %d certificates, want the leaf and istiod's root", len(chain))
	}
	if id := chain[0].URIs; len(id) != 1 || id[0].String() != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Errorf("identity %v", id)
	}
	if !chain[len(chain)-1].Equal(istioRoots[0]) {
		t.Errorf("chain ends at %s, want istiod's root %s", chain[len(chain)-1].Subject, istioRoots[0].Subject)
	}
	pool := x509.NewCertPool()
	pool.AddCert(istioRoots[0])
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("Go: %v", err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	other := testkit.SelfSigned(t, testkit.Spec{Name: "not-istiod", IsCA: true, Life: time.Hour})
	for _, stack := range []string{testkit.StackOpenSSL, testkit.StackBoringSSL} {
		if err := testkit.ToolAccepts(t, stack, chain[:len(chain)-1], key, istioRoots); err != nil {
			t.Errorf("%s trusting istiod's root: %v", stack, err)
		}
		if err := testkit.ToolAccepts(t, stack, chain[:len(chain)-1], key, []*x509.Certificate{other.Cert}); err == nil {
			t.Errorf("%s accepted istiod's chain trusting another root", stack)
		}
	}
}
