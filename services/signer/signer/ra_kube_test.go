//go:build kube

package signer

// The signer as a registration authority (istiod's EXTERNAL_CA=ISTIOD_RA_KUBERNETES_API
// and K8S_SIGNER) against a real API server: it authenticates the pod by
// TokenReview as always, then creates, approves and waits on a
// CertificateSigningRequest that a real kube-controller-manager's CSR signing
// controller fulfils (hack/kube-apiserver.sh builds it beside the API server),
// and deletes it. The refusals use a signer name no controller serves, where
// the test itself plays the external signer over the API.

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// raTestSigner is a signer name nothing serves but the test (testExternalSigner).
const raTestSigner = "example.com/meshagent-test"

// raClientUsages are the key usages kube-controller-manager's
// kubernetes.io/kube-apiserver-client signer signs (it fails a CSR asking server auth).
const raClientUsages = "digital signature,key encipherment,client auth"

// raAccount gives the signer's service account what a registration authority
// needs (docs/kubernetes.md): TokenReview, and create, get, watch and delete
// CSRs, approve them, for signers only.
func raAccount(t *testing.T, k *kubetest.Server, signers ...string) string {
	t.Helper()
	k.Admin.Create(t, "/apis/rbac.authorization.k8s.io/v1/clusterroles", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": map[string]any{"name": "test-signer-ra"},
		"rules": []any{
			map[string]any{"apiGroups": []string{"certificates.k8s.io"}, "resources": []string{"certificatesigningrequests"}, "verbs": []string{"create", "get", "watch", "delete"}},
			map[string]any{"apiGroups": []string{"certificates.k8s.io"}, "resources": []string{"certificatesigningrequests/approval"}, "verbs": []string{"update"}},
			map[string]any{"apiGroups": []string{"certificates.k8s.io"}, "resources": []string{"signers"}, "resourceNames": signers, "verbs": []string{"approve"}},
		},
	})
	return signerAccount(t, k, "system:auth-delegator", "test-signer-ra")
}

// startRA runs the signer as a registration authority for signerName, with the
// external signer's root in extRoot, Istio's env names for the mode.
func startRA(t *testing.T, k *kubetest.Server, token, signerName, extRoot, timeout string, more ...string) *kubeSigner {
	t.Helper()
	return startKubeSignerEnv(t, k, token, []string{"EXTERNAL_CA=ISTIOD_RA_KUBERNETES_API", "K8S_SIGNER=" + signerName},
		append([]string{"-token-review", "-token-review-url", k.URL, "-token-issuer-ca-file", k.CAFile, "-token-issuer-bearer-file", token,
			"-external-ca-cert-file", extRoot, "-k8s-signer-usages", raClientUsages, "-k8s-csr-timeout", timeout,
			"-k8s-csr-api-url", k.URL, "-k8s-csr-api-ca-file", k.CAFile, "-k8s-csr-api-bearer-file", token}, more...)...)
}

// csrObjects lists the CSR objects in the API server, by name.
func csrObjects(t *testing.T, k *kubetest.Server) []string {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata kubetest.Meta `json:"metadata"`
		} `json:"items"`
	}
	k.Admin.Call(t, http.MethodGet, "/apis/certificates.k8s.io/v1/certificatesigningrequests", nil, &list)
	var out []string
	for _, it := range list.Items {
		out = append(out, it.Metadata.Name)
	}
	return out
}

// records counts what the signer recorded: cert.issued events and issued records.
func records(t *testing.T, s *kubeSigner) (issuedEvents uint64, podRecords int) {
	t.Helper()
	js, err := jetstream.New(s.nc)
	if err != nil {
		t.Fatal(err)
	}
	issuedEvents = count(t, js, events.SubjectCertIssued)
	kv, err := js.KeyValue(context.Background(), policy.BucketIssued)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for range keys.Keys() {
		podRecords++
	}
	return issuedEvents, podRecords
}

// A pod with a real TokenRequest token gets a certificate kube-controller-manager
// signed: the chain ends at the external signer's root, which the trust bundle
// (and istio-ca-root-cert) carries endorsed by the mesh CA; Go and OpenSSL verify it as a client
// certificate, and a pod trusting the mesh root takes it over the bus; each
// certificate is recorded (cert.issued, the pod's record) and its CSR object deleted. A CSR naming another identity is refused before any
// CSR object is made, and the control shows why: kcm signs whatever a CSR names.
func TestKubeRegistrationAuthorityThroughKubeControllerManager(t *testing.T) {
	k := kubetest.Start(t)
	ext := testkit.SelfSigned(t, testkit.Spec{Name: "external signer (kube-controller-manager)", IsCA: true, Life: 24 * time.Hour})
	kcm := k.StartControllerManager(t, ext)
	applyManifest(t, k, "../../../deploy/kubernetes/base/signer-rbac.yaml") // the root ConfigMap's
	token := raAccount(t, k, kubetest.KubeAPIServerClientSigner)
	uid := shop(t, k)
	s := startRA(t, k, token, kubetest.KubeAPIServerClientSigner, kcm.CAFile, "60s",
		"-root-configmap", "istio-ca-root-cert", "-root-configmap-api-url", k.URL, "-root-configmap-api-ca-file", k.CAFile, "-root-configmap-api-bearer-file", token)

	// The bundle holds the mesh root and the external signer's, endorsed by the
	// mesh CA: a pod that trusts the mesh root takes it.
	b := bundle(t, s.nc)
	roots, err := pki.ParseCertPEMs(b.Roots)
	if err != nil {
		t.Fatal(err)
	}
	if len(roots) != 2 || !roots[1].Equal(ext.Cert) {
		t.Fatalf("bundle: %d roots, the external signer's last: %v; want the mesh root, then the external signer's", len(roots), len(roots) == 2 && roots[1].Equal(ext.Cert))
	}
	mesh := roots[:1]
	if err := signertest.VerifyEndorsed(mesh, "cluster.local", b.Generation, b.Roots, b.Endorsements); err != nil {
		t.Fatalf("the bundle with the external root is not endorsed under the mesh root: %v", err)
	}
	if err := signertest.VerifyEndorsed([]*x509.Certificate{ext.Cert}, "cluster.local", b.Generation, b.Roots, b.Endorsements); err == nil {
		t.Fatal("control: the bundle verified under the external root alone, which endorses nothing")
	}
	// And istio-ca-root-cert, what a sidecar mounts before its first certificate, holds both.
	testkit.Eventually(t, "both roots in shop's istio-ca-root-cert", func() bool {
		var cm struct {
			Data map[string]string `json:"data"`
		}
		code, raw, err := k.Admin.Do(context.Background(), http.MethodGet, "/api/v1/namespaces/shop/configmaps/istio-ca-root-cert", nil, "")
		return err == nil && code == http.StatusOK && json.Unmarshal(raw, &cm) == nil && cm.Data["root-cert.pem"] == strings.Join(b.Roots, "")
	})

	c, _ := s.client(t)
	pod := k.Admin.RequestToken(t, "shop", "web", "istio-ca", "web-1", uid, 600)
	key, csr := signertest.CSR(t, pki.ECP256, webID)
	start := time.Now()
	rep, err := istioCreate(c, pod, "", csr, 3600)
	if err != nil {
		t.Fatalf("CreateCertificate through kube-controller-manager: %v\n%s", err, k.Logs.String())
	}
	t.Logf("certificate from kube-controller-manager in %s: %d PEMs", time.Since(start).Round(time.Millisecond), len(rep.CertChain))
	leaf := verifyChain(t, rep.CertChain, b.Roots, time.Now())
	chain, err := pki.ParseCertPEMs(rep.CertChain)
	if err != nil {
		t.Fatal(err)
	}
	if !chain[len(chain)-1].Equal(ext.Cert) || leaf.CheckSignatureFrom(ext.Cert) != nil {
		t.Fatalf("the leaf is not the external signer's: issuer %q", leaf.Issuer)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != webID || !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Fatalf("leaf names %v with extended key usages %v; want %s, client auth only (kcm's kube-apiserver-client signer)", leaf.URIs, leaf.ExtKeyUsage, webID)
	}
	t.Logf("kcm's leaf: %s, valid %s to %s, key usage %d (digital signature 1 | key encipherment 4), extended %v", leaf.URIs[0], leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), int(leaf.KeyUsage), leaf.ExtKeyUsage)

	// Outside Go: OpenSSL verifies it for a TLS client; as a TLS server's, OpenSSL
	// and BoringSSL refuse it for its extended key usage (the difference from
	// Istio's own leaves, docs/istio.md). The control, a leaf of the same CA for the
	// same ID with server auth too, both take: the chain is sound, only the usage differs.
	extPool := x509.NewCertPool()
	extPool.AddCert(ext.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: extPool}); err == nil { // Go's TLS client asks server auth
		t.Fatal("Go verified a client-auth-only leaf for server auth")
	} else {
		t.Logf("Go, for server auth (expected to refuse): %v", err)
	}
	if err := testkit.OpenSSLVerifiesFor(t, "sslclient", chain, []*x509.Certificate{ext.Cert}); err != nil {
		t.Fatalf("OpenSSL, for a TLS client: %v", err)
	}
	if err := testkit.OpenSSLVerifiesFor(t, "sslserver", chain, []*x509.Certificate{ext.Cert}); err == nil {
		t.Fatal("OpenSSL took a client-auth-only leaf for a TLS server")
	} else {
		t.Logf("OpenSSL, for a TLS server (expected to refuse): %v", err)
	}
	for _, stack := range []string{testkit.StackOpenSSL, testkit.StackBoringSSL} {
		err := testkit.ToolAccepts(t, stack, chain, key, []*x509.Certificate{ext.Cert})
		if err == nil {
			t.Fatalf("%s accepted a client-auth-only leaf from a TLS server", stack)
		}
		t.Logf("%s, the leaf served (expected to refuse): %v", stack, err)
		control := ext.CA().Issue(t, testkit.Spec{ID: webID, Key: key, Life: 3 * time.Hour})
		if err := testkit.ToolAccepts(t, stack, []*x509.Certificate{control.Cert, ext.Cert}, key, []*x509.Certificate{ext.Cert}); err != nil {
			t.Fatalf("control: %s refused a server-and-client leaf of the same CA and key: %v", stack, err)
		}
	}

	js, _ := jetstream.New(s.nc)
	if got := last[events.CertIssued](t, js, events.SubjectCertIssued); got.Serial != pki.SerialHex(leaf) || got.RootFingerprint != pki.Fingerprint(ext.Cert) || got.SPIFFEID != webID {
		t.Fatalf("cert.issued: serial %s root %s id %s; want the kcm leaf's %s under the external root", got.Serial, got.RootFingerprint, got.SPIFFEID, pki.SerialHex(leaf))
	}

	// Over the bus, as meshagent's own pods sign, twice (the second reply reuses the
	// external chain's encoding): a pod trusting only the mesh root takes the reply's
	// bundle, endorsed, and then the chain ending at the external root.
	for i := range 2 {
		_, csr := signertest.CSR(t, pki.ECP256, webID)
		rep := natsSign(t, s.nc, events.SignRequest{CSR: string(csr), Token: pod, TTL: time.Hour})
		if rep.Error != nil {
			t.Fatalf("over the bus (%d): %+v", i, rep.Error)
		}
		trust := trustbundle.New("cluster.local", mesh, nil)
		u, err := trust.Check(trustbundle.FromSignReply(rep))
		if err != nil {
			t.Fatalf("over the bus (%d): a pod trusting the mesh root refuses the reply's bundle: %v", i, err)
		}
		trust.Apply(u)
		got, err := pki.ParseCertPEMs(rep.CertChain)
		if err != nil {
			t.Fatal(err)
		}
		if err := trust.VerifyChain(got, nil, time.Now()); err != nil || !got[len(got)-1].Equal(ext.Cert) || got[0].URIs[0].String() != webID {
			t.Fatalf("over the bus (%d): chain of %d to the external root %v, for %s: %v", i, len(got), got[len(got)-1].Equal(ext.Cert), got[0].URIs, err)
		}
	}
	ev, recs := records(t, s)
	if ev != 3 || recs != 3 {
		t.Fatalf("recorded %d cert.issued and %d pod records, want 3 and 3", ev, recs)
	}
	testkit.Eventually(t, "the CSR object deleted", func() bool { return len(csrObjects(t, k)) == 0 })

	// A CSR that names another identity: refused before it reaches the API server.
	_, greedy := signertest.CSR(t, pki.ECP256, askedID)
	if _, err := istioCreate(c, pod, "", greedy, 3600); status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "must name exactly the caller's identity") {
		t.Fatalf("a CSR naming %s: %v; want InvalidArgument", askedID, err)
	}
	if ev, recs := records(t, s); ev != 3 || recs != 3 {
		t.Fatalf("after the refusal: %d cert.issued, %d pod records; want still 3 and 3", ev, recs)
	}
	if names := csrObjects(t, k); len(names) != 0 {
		t.Fatalf("CSR objects after the refusal: %v", names)
	}
	// The control: the same CSR approved straight into the API server gets what it names.
	signed, failed := adminCSR(t, k, "admin-greedy", kubetest.KubeAPIServerClientSigner, strings.Split(raClientUsages, ","), greedy)
	if signed == nil || len(signed.URIs) != 1 || signed.URIs[0].String() != askedID {
		t.Fatalf("control: kcm gave the greedy CSR %v (failed: %q)", signed, failed)
	}
	t.Logf("control: kcm signs what a CSR names: %s", signed.URIs[0])

	// Why K8S_SIGNER_USAGES must drop server auth for this signer: istiod's usages fail.
	_, webCSR := signertest.CSR(t, pki.ECP256, webID)
	if signed, failed := adminCSR(t, k, "admin-istiod-usages", kubetest.KubeAPIServerClientSigner,
		[]string{"digital signature", "key encipherment", "server auth", "client auth"}, webCSR); signed != nil || !strings.Contains(failed, "server auth") {
		t.Fatalf("istiod's usages at kcm's kube-apiserver-client signer: signed %v, failed %q", signed != nil, failed)
	} else {
		t.Logf("istiod's usages at kcm's kubernetes.io/kube-apiserver-client: Failed %s", failed)
	}
}

// adminCSR creates, approves (as admin) and waits on a CSR named name for
// signerName with usages, and returns the certificate the signer wrote, or the
// message of the Failed condition it set.
func adminCSR(t *testing.T, k *kubetest.Server, name, signerName string, usages []string, csrPEM []byte) (*x509.Certificate, string) {
	t.Helper()
	path := "/apis/certificates.k8s.io/v1/certificatesigningrequests/" + name
	var obj map[string]any
	k.Admin.Call(t, http.MethodPost, "/apis/certificates.k8s.io/v1/certificatesigningrequests", map[string]any{
		"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"request": csrPEM, "signerName": signerName, "usages": usages},
	}, &obj)
	obj["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Approved", "status": "True", "reason": "Test", "message": "control"}}}
	k.Admin.Call(t, http.MethodPut, path+"/approval", obj, nil)
	var cert *x509.Certificate
	var failed string
	testkit.Eventually(t, "kcm to sign or fail "+name, func() bool {
		var got struct {
			Status struct {
				Certificate []byte `json:"certificate"`
				Conditions  []struct {
					Type, Reason, Message string
				} `json:"conditions"`
			} `json:"status"`
		}
		k.Admin.Call(t, http.MethodGet, path, nil, &got)
		for _, c := range got.Status.Conditions {
			if c.Type == "Failed" {
				failed = c.Reason + ": " + c.Message
				return true
			}
		}
		if len(got.Status.Certificate) == 0 {
			return false
		}
		certs, err := pki.ParseCertsPEM(got.Status.Certificate)
		if err != nil {
			t.Fatal(err)
		}
		cert = certs[0]
		return true
	})
	k.Admin.Call(t, http.MethodDelete, path, nil, nil)
	return cert, failed
}

// testExternalSigner plays an external signer over the API server, as admin:
// every approved CSR for raTestSigner it sees is failed (mode "fail") or signed
// with ca (mode "sign"); mode "" leaves it be. It stops with the test.
type testExternalSigner struct {
	mu   sync.Mutex
	mode string
}

func (x *testExternalSigner) set(mode string) {
	x.mu.Lock()
	x.mode = mode
	x.mu.Unlock()
}

func (x *testExternalSigner) run(t *testing.T, k *kubetest.Server, ca *testkit.CA) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			x.mu.Lock()
			mode := x.mode
			x.mu.Unlock()
			if mode != "" {
				x.pass(ctx, k, ca, mode)
			}
		}
	}()
}

// pass looks at every CSR once.
func (x *testExternalSigner) pass(ctx context.Context, k *kubetest.Server, ca *testkit.CA, mode string) {
	code, raw, err := k.Admin.Do(ctx, http.MethodGet, "/apis/certificates.k8s.io/v1/certificatesigningrequests", nil, "")
	if err != nil || code != http.StatusOK {
		return
	}
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if json.Unmarshal(raw, &list) != nil {
		return
	}
	for _, obj := range list.Items {
		spec, _ := obj["spec"].(map[string]any)
		st, _ := obj["status"].(map[string]any)
		if spec["signerName"] != raTestSigner || st == nil || st["certificate"] != nil {
			continue
		}
		conds, _ := st["conditions"].([]any)
		approved, failed := false, false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			approved = approved || m["type"] == "Approved"
			failed = failed || m["type"] == "Failed"
		}
		if !approved || failed {
			continue
		}
		switch mode {
		case "fail":
			st["conditions"] = append(conds, map[string]any{"type": "Failed", "status": "True", "reason": "TestSignerRefused", "message": "the test's external signer refuses this request"})
		case "sign":
			cert, err := signCSRObject(spec, ca)
			if err != nil {
				continue
			}
			st["certificate"] = cert
		}
		name := obj["metadata"].(map[string]any)["name"].(string)
		body, _ := json.Marshal(obj)
		_, _, _ = k.Admin.Do(ctx, http.MethodPut, "/apis/certificates.k8s.io/v1/certificatesigningrequests/"+url.PathEscape(name)+"/status", body, "application/json")
	}
}

// signCSRObject signs a CSR object's request as kcm's kube-apiserver-client
// signer would: its URIs, client auth, an hour.
func signCSRObject(spec map[string]any, ca *testkit.CA) ([]byte, error) {
	var req []byte
	raw, _ := json.Marshal(spec["request"])
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, err
	}
	b, _ := pem.Decode(req)
	if b == nil {
		return nil, errors.New("no PEM")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: serial, URIs: csr.URIs,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca.Cert, csr.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// A CSR nobody signs in time, one the external signer fails, and one the signer
// may not approve (RBAC) each get a clear error: no certificate, no cert.issued,
// no pod record, and no CSR object left. The control: the same signer, the same
// pod, the external signer signing, gets its certificate and its record.
func TestKubeRegistrationAuthorityRefusals(t *testing.T) {
	k := kubetest.Start(t)
	ext := testkit.SelfSigned(t, testkit.Spec{Name: "external signer (test)", IsCA: true, Life: 24 * time.Hour})
	extFile := k.WriteFile(t, "external-root.pem", ext.PEM())
	token := raAccount(t, k, raTestSigner)
	uid := shop(t, k)
	// A signer that waits 3 s, for the CSR nobody signs; one that waits a minute,
	// which a loaded machine never runs out, for the verdicts.
	impatient := startRA(t, k, token, raTestSigner, extFile, "3s")
	s := startRA(t, k, token, raTestSigner, extFile, "60s")
	pod := k.Admin.RequestToken(t, "shop", "web", "istio-ca", "web-1", uid, 600)
	_, csr := signertest.CSR(t, pki.ECP256, webID)
	x := &testExternalSigner{}
	x.run(t, k, ext.CA())

	refused := func(what string, s *kubeSigner, want codes.Code, says string) {
		t.Helper()
		c, _ := s.client(t)
		rep, err := istioCreate(c, pod, "", csr, 3600)
		if status.Code(err) != want || !strings.Contains(status.Convert(err).Message(), says) {
			t.Fatalf("%s: %v (%d PEMs); want %s saying %q", what, err, len(rep.GetCertChain()), want, says)
		}
		t.Logf("%s: %s: %s", what, status.Code(err), status.Convert(err).Message())
		if ev, recs := records(t, s); ev != 0 || recs != 0 {
			t.Fatalf("%s: %d cert.issued, %d pod records; want none", what, ev, recs)
		}
		testkit.Eventually(t, what+": no CSR object left", func() bool { return len(csrObjects(t, k)) == 0 })
	}

	refused("nobody signs", impatient, codes.Unavailable, "no certificate within 3s")
	x.set("fail")
	refused("the external signer fails it", s, codes.PermissionDenied, "TestSignerRefused")

	// Not allowed to approve for this signer name: the API server refuses the approval.
	other := startRA(t, k, token, "example.com/not-granted", extFile, "60s")
	refused("approval without RBAC", other, codes.Unavailable, "not permitted to approve")

	// The control.
	x.set("sign")
	c, _ := s.client(t)
	rep, err := istioCreate(c, pod, "", csr, 3600)
	if err != nil {
		t.Fatalf("control: the external signer signing: %v", err)
	}
	if id := verifyChain(t, rep.CertChain, bundle(t, s.nc).Roots, time.Now()).URIs[0].String(); id != webID {
		t.Fatalf("control: issued to %s", id)
	}
	if ev, recs := records(t, s); ev != 1 || recs != 1 {
		t.Fatalf("control: %d cert.issued, %d pod records; want 1 and 1", ev, recs)
	}
}
