//go:build kube

package signer

// The signer's Kubernetes paths against a real API server (tests/kubetest: etcd and a
// kube-apiserver built by hack/kube-apiserver.sh), with the real signer binary:
// TokenReview of projected, pod-bound service-account tokens; OIDC discovery and
// the JWKS of the API server's service-account issuer; impersonation by a node
// agent checked against real pod objects; the root ConfigMap publisher through a
// rotation. Pods are created with spec.nodeName set: nothing schedules or runs them.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

// kubeSigner is a real signer process on an embedded bus, talking to a real API server.
type kubeSigner struct {
	kube  *kubetest.Server
	nc    *nats.Conn
	grpc  string
	svc   *testkit.Service
	token string // the signer's own service-account token file
}

// signerAccount creates the signer's service account (meshagent-system/signer, as
// deploy/kubernetes names it), binds it to clusterRoles and writes a token of it
// (audience: the API server) to a file, as the kubelet would mount it.
func signerAccount(t *testing.T, k *kubetest.Server, clusterRoles ...string) string {
	t.Helper()
	a := k.Admin
	a.Namespace(t, "meshagent-system", map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	a.ServiceAccount(t, "meshagent-system", "signer")
	for _, role := range clusterRoles {
		a.Create(t, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
			"metadata": map[string]any{"name": "test-signer-" + strings.ReplaceAll(role, ":", "-")},
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
			"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "signer", "namespace": "meshagent-system"}},
		})
	}
	return k.WriteFile(t, "signer.token", a.RequestToken(t, "meshagent-system", "signer", k.URL, "", "", 3600))
}

// startKubeSigner runs the signer binary with args on a fresh bus.
func startKubeSigner(t *testing.T, k *kubetest.Server, token string, args ...string) *kubeSigner {
	t.Helper()
	return startKubeSignerEnv(t, k, token, nil, args...)
}

// startKubeSignerEnv is startKubeSigner with env vars besides the bus and the KEK.
func startKubeSignerEnv(t *testing.T, k *kubetest.Server, token string, env []string, args ...string) *kubeSigner {
	t.Helper()
	srv := bustest.Server(t)
	s := &kubeSigner{kube: k, nc: bustest.Conn(t, srv), grpc: testkit.FreeAddr(t), token: token}
	s.svc = testkit.StartService(t, "signer", append([]string{"-instance", "kube-test", "-grpc-addr", s.grpc, "-log-level", "debug", "-root-rotate-min-interval", "0"}, args...),
		append([]string{"NATS_URL=" + srv.ClientURL(), "CA_KEK_FILE=" + signertest.KEKFile(t)}, env...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("signer's log:\n%s", s.svc.Logs.String())
		}
	})
	return s
}

// client dials the signer's Istio CA API as an Istio agent does.
func (s *kubeSigner) client(t *testing.T) (pb.IstioCertificateServiceClient, []string) {
	t.Helper()
	roots := bundle(t, s.nc).Roots
	certs, err := pki.ParseCertPEMs(roots)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	cc, err := grpc.NewClient("passthrough:///"+s.grpc, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return pb.NewIstioCertificateServiceClient(cc), roots
}

// issuedTo asks for a certificate with token and returns its SPIFFE ID, or the error.
func issuedTo(t *testing.T, c pb.IstioCertificateServiceClient, roots []string, token string) (string, error) {
	t.Helper()
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	rep, err := istioCreate(c, token, "", csr, 3600)
	if err != nil {
		return "", err
	}
	return verifyChain(t, rep.CertChain, roots, time.Now()).URIs[0].String(), nil
}

// shop creates namespace shop (Pod Security "restricted") with service account web
// and pod web-1 of it on node-a, and returns the pod's uid.
func shop(t *testing.T, k *kubetest.Server) string {
	t.Helper()
	k.Admin.Namespace(t, "shop", map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	k.Admin.ServiceAccount(t, "shop", "web")
	return k.Admin.Pod(t, "shop", "web-1", "web", "node-a")
}

const webID = "spiffe://cluster.local/ns/shop/sa/web"

// TokenReview mode: a projected token from the TokenRequest API (audience
// istio-ca, bound to a pod) is accepted for its service account's identity; a token
// of another audience is refused; once the pod is deleted the API server no longer
// vouches for the token and the signer refuses it (after its verdict cache, 1 s
// here), even when a new pod of the same name exists.
func TestKubeTokenReviewOfPodBoundTokens(t *testing.T) {
	k := kubetest.Start(t)
	token := signerAccount(t, k, "system:auth-delegator")
	uid := shop(t, k)
	s := startKubeSigner(t, k, token, "-token-review", "-token-review-url", k.URL,
		"-token-issuer-ca-file", k.CAFile, "-token-issuer-bearer-file", token, "-token-review-cache", "1s")
	c, roots := s.client(t)

	pod := k.Admin.RequestToken(t, "shop", "web", "istio-ca", "web-1", uid, 600)
	if id, err := issuedTo(t, c, roots, pod); err != nil || id != webID {
		t.Fatalf("pod-bound istio-ca token: issued to %q, %v; want %s", id, err, webID)
	}
	other := k.Admin.RequestToken(t, "shop", "web", "some-other-audience", "web-1", uid, 600)
	if id, err := issuedTo(t, c, roots, other); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("token for another audience: issued to %q, %v; want Unauthenticated", id, err)
	}

	k.Admin.DeletePod(t, "shop", "web-1")
	k.Admin.Pod(t, "shop", "web-1", "web", "node-a") // same name, new uid
	var last error
	testkit.Eventually(t, "the deleted pod's token refused", func() bool {
		_, last = issuedTo(t, c, roots, pod)
		return status.Code(last) == codes.Unauthenticated
	})
	if !strings.Contains(status.Convert(last).Message(), "api server refused the token") {
		t.Fatalf("refusal does not say the API server refused the token: %v", last)
	}
}

// Without system:auth-delegator the API server refuses the signer's TokenReviews:
// the signer answers Unavailable (no verdict on the token), never issues.
func TestKubeTokenReviewWithoutPermissionIsUnavailable(t *testing.T) {
	k := kubetest.Start(t)
	token := signerAccount(t, k) // no role
	uid := shop(t, k)
	s := startKubeSigner(t, k, token, "-token-review", "-token-review-url", k.URL,
		"-token-issuer-ca-file", k.CAFile, "-token-issuer-bearer-file", token)
	c, roots := s.client(t)
	pod := k.Admin.RequestToken(t, "shop", "web", "istio-ca", "web-1", uid, 600)
	id, err := issuedTo(t, c, roots, pod)
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "system:auth-delegator") {
		t.Fatalf("issued to %q, %v; want Unavailable naming system:auth-delegator", id, err)
	}
}

// Discovery mode: the signer reads the issuer's discovery document and JWKS from
// the API server (-token-issuer-discovery, with its own token, which the default
// binding system:service-account-issuer-discovery allows) and verifies projected
// tokens offline. A token of the same issuer name signed by another key is
// refused. Offline verification cannot see a pod's deletion: the token stays good
// until it expires (docs/kubernetes.md), which is why TokenReview mode exists.
func TestKubeOIDCDiscoveryOfTheServiceAccountIssuer(t *testing.T) {
	k := kubetest.Start(t)
	token := signerAccount(t, k)
	uid := shop(t, k)
	s := startKubeSigner(t, k, token, "-token-issuer-discovery", "-token-issuer", k.URL,
		"-token-issuer-ca-file", k.CAFile, "-token-issuer-bearer-file", token)
	c, roots := s.client(t)

	pod := k.Admin.RequestToken(t, "shop", "web", "istio-ca", "web-1", uid, 600)
	if id, err := issuedTo(t, c, roots, pod); err != nil || id != webID {
		t.Fatalf("pod-bound token verified by discovery: issued to %q, %v", id, err)
	}
	wrongAud := k.Admin.RequestToken(t, "shop", "web", k.URL, "web-1", uid, 600)
	if _, err := issuedTo(t, c, roots, wrongAud); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("token for the API server's audience: %v, want Unauthenticated", err)
	}
	forged := tokentest.NewIssuer(t, k.URL) // same iss, a key the API server never had
	claims := forged.ServiceAccount("shop", "web", time.Now().Add(-time.Second), time.Hour).ForPod("web-1")
	if _, err := issuedTo(t, c, roots, forged.Mint(t, claims)); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("token signed by a key not in the API server's JWKS: %v, want Unauthenticated", err)
	}
	k.Admin.DeletePod(t, "shop", "web-1")
	if id, err := issuedTo(t, c, roots, pod); err != nil || id != webID {
		t.Fatalf("offline verification after the pod's deletion: %q, %v (expected still accepted: only TokenReview sees the deletion)", id, err)
	}
}

// A trusted node agent (CA_TRUSTED_NODE_ACCOUNTS) gets the identity of a workload
// whose real pod object runs on the agent's node, and is refused one on another
// node; the signer reads pods with a ClusterRole allowing get and list pods.
func TestKubeImpersonationAgainstRealPods(t *testing.T) {
	k := kubetest.Start(t)
	a := k.Admin
	a.Create(t, "/apis/rbac.authorization.k8s.io/v1/clusterroles", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": map[string]any{"name": "test-signer-pods"},
		"rules": []any{map[string]any{"apiGroups": []string{""}, "resources": []string{"pods"}, "verbs": []string{"get", "list"}}},
	})
	token := signerAccount(t, k, "system:auth-delegator", "test-signer-pods")
	shop(t, k)
	a.ServiceAccount(t, "shop", "db")
	a.Pod(t, "shop", "db-1", "db", "node-b")
	a.Namespace(t, "istio-system", nil)
	a.ServiceAccount(t, "istio-system", "ztunnel")
	zuid := a.Pod(t, "istio-system", "ztunnel-a", "ztunnel", "node-a")

	s := startKubeSigner(t, k, token, "-token-review", "-token-review-url", k.URL,
		"-token-issuer-ca-file", k.CAFile, "-token-issuer-bearer-file", token,
		"-trusted-node-accounts", "istio-system/ztunnel", "-node-api-url", k.URL, "-node-api-ca-file", k.CAFile, "-node-api-bearer-file", token)
	c, roots := s.client(t)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	ztunnel := a.RequestToken(t, "istio-system", "ztunnel", "istio-ca", "ztunnel-a", zuid, 600)

	got, err := istioImpersonate(c, ztunnel, webID, csr)
	if err != nil {
		t.Fatalf("node agent for a workload on its node: %v", err)
	}
	if id := verifyChain(t, got.CertChain, roots, time.Now()).URIs[0].String(); id != webID {
		t.Fatalf("issued for %s, want %s", id, webID)
	}
	refused := func(what, token, target, want string) {
		t.Helper()
		rep, err := istioImpersonate(c, token, target, csr)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), want) {
			t.Fatalf("%s: got %v (%v), want PermissionDenied naming %q", what, err, rep, want)
		}
	}
	refused("workload on another node", ztunnel, "spiffe://cluster.local/ns/shop/sa/db", `on node "node-a"`)
	web := a.RequestToken(t, "shop", "web", "istio-ca", "", "", 600)
	refused("a workload that is no node agent", web, "spiffe://cluster.local/ns/shop/sa/db", "not a trusted node account")
	unbound := a.RequestToken(t, "istio-system", "ztunnel", "istio-ca", "", "", 600)
	refused("node agent without a pod-bound token", unbound, webID, "pod-bound token")
}

// The root publisher: with -root-configmap and the RBAC of deploy/kubernetes, every
// namespace gets istio-ca-root-cert holding the bundle, a new namespace gets it, a
// hand edit and a deletion are undone, a terminating namespace is left alone, and
// a root rotation puts old and new roots in every namespace within seconds, with
// no write refused.
func TestKubeRootConfigMapThroughRotation(t *testing.T) {
	k := kubetest.Start(t)
	a := k.Admin
	applyManifest(t, k, "../../../deploy/kubernetes/base/signer-rbac.yaml")
	token := signerAccount(t, k)
	shop(t, k)
	a.Namespace(t, "other", nil)
	s := startKubeSigner(t, k, token, "-root-configmap", "istio-ca-root-cert", "-root-configmap-api-url", k.URL,
		"-root-configmap-api-ca-file", k.CAFile, "-root-configmap-api-bearer-file", token)
	want := strings.Join(bundle(t, s.nc).Roots, "")

	namespaces := []string{"default", "kube-system", "kube-public", "meshagent-system", "shop", "other"}
	published := func(ns string) (string, bool) {
		var cm struct {
			Metadata kubetest.Meta     `json:"metadata"`
			Data     map[string]string `json:"data"`
		}
		code, raw, err := a.Do(context.Background(), http.MethodGet, "/api/v1/namespaces/"+ns+"/configmaps/istio-ca-root-cert", nil, "")
		if err != nil || code != http.StatusOK || json.Unmarshal(raw, &cm) != nil {
			return "", false
		}
		return cm.Data["root-cert.pem"], true
	}
	allHave := func(what, want string, nss ...string) {
		t.Helper()
		testkit.EventuallyWithin(t, 30*time.Second, what, func() bool {
			for _, ns := range nss {
				if v, _ := published(ns); v != want {
					return false
				}
			}
			return true
		})
	}
	allHave("the bundle in every namespace", want, namespaces...)

	a.Namespace(t, "late", nil)
	allHave("the bundle in a namespace created later", want, "late")

	var cm map[string]any
	a.Call(t, http.MethodGet, "/api/v1/namespaces/shop/configmaps/istio-ca-root-cert", nil, &cm)
	cm["data"] = map[string]string{"root-cert.pem": "-----BEGIN CERTIFICATE-----\nnot the mesh's root\n-----END CERTIFICATE-----\n"}
	a.Call(t, http.MethodPut, "/api/v1/namespaces/shop/configmaps/istio-ca-root-cert", cm, nil)
	a.Call(t, http.MethodDelete, "/api/v1/namespaces/other/configmaps/istio-ca-root-cert", nil, nil)
	allHave("an edited ConfigMap corrected and a deleted one put back", want, "shop", "other")

	// A namespace being deleted (Terminating for good here: no controller manager
	// empties it) is no longer written to: its ConfigMap keeps the old bundle.
	a.Call(t, http.MethodDelete, "/api/v1/namespaces/other", nil, nil)
	testkit.Eventually(t, "namespace other terminating", func() bool {
		var ns struct {
			Status struct {
				Phase string `json:"phase"`
			} `json:"status"`
		}
		a.Call(t, http.MethodGet, "/api/v1/namespaces/other", nil, &ns)
		return ns.Status.Phase == "Terminating"
	})
	namespaces = slices.DeleteFunc(namespaces, func(ns string) bool { return ns == "other" })

	start := time.Now()
	rr := natsCall[events.RotateRequest, events.RotateReply](t, s.nc, events.SubjectRootRotate, events.RotateRequest{Reason: "kube test"})
	if rr.Error != nil || len(rr.Roots) < 2 {
		t.Fatalf("rotate: %+v", rr)
	}
	rotated := strings.Join(rr.Roots, "")
	if !strings.Contains(rotated, strings.TrimSpace(want)) {
		t.Fatal("the rotated bundle lost the old root")
	}
	allHave("old and new roots in every namespace after the rotation", rotated, append(namespaces, "late")...)
	t.Logf("rotation to %d roots in every ConfigMap after %s", len(rr.Roots), time.Since(start).Round(time.Millisecond))
	if v, ok := published("other"); !ok || v != want {
		t.Errorf("the terminating namespace's ConfigMap was rewritten (present %v)", ok)
	}
	if m := strings.Join(metricLines(t, s.svc, "meshagent_signer_root_configmap_write_failures_total"), ""); !strings.HasSuffix(m, " 0") {
		t.Errorf("write failures: %q", m)
	}
}

// applyManifest applies every object of a YAML file server-side, as admin.
func applyManifest(t *testing.T, k *kubetest.Server, path string) {
	t.Helper()
	data, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		if _, _, err := k.Admin.ApplyYAML(context.Background(), []byte(doc), "kube-test", ""); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
}

func metricLines(t *testing.T, s *testkit.Service, name string) []string {
	t.Helper()
	_, body := testkit.HTTPGet("http://" + s.HTTPAddr + "/metrics")
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, name+" ") {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s in /metrics", name)
	}
	return out
}
