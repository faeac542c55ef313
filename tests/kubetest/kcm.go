package kubetest

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshagent/meshagent/tests/testkit"
)

// KCMUser is the user kube-controller-manager runs as (a static token of the
// API server): bootstrap RBAC grants it system:kube-controller-manager's role, and
// StartControllerManager binds it to the certificate controller's as well, which
// a controller manager without per-controller service accounts
// (--use-service-account-credentials=false) needs to sign.
const KCMUser = "system:kube-controller-manager"

const kcmToken = "meshagent-kubetest-kcm"

// KubeAPIServerClientSigner is the signer name kube-controller-manager's CSR
// signing controller signs for with StartControllerManager's CA: the one of its
// signers that accepts a URI SAN (a SPIFFE ID). It signs only the key usages
// digital signature, key encipherment and client auth.
const KubeAPIServerClientSigner = "kubernetes.io/kube-apiserver-client"

// ControllerManagerPath is where kube-controller-manager is:
// $MESHAGENT_KUBE_CONTROLLER_MANAGER, or beside the kube-apiserver (BinaryPath),
// where hack/kube-apiserver.sh builds both.
func ControllerManagerPath() string {
	if p := os.Getenv("MESHAGENT_KUBE_CONTROLLER_MANAGER"); p != "" {
		return p
	}
	return filepath.Join(filepath.Dir(BinaryPath()), "kube-controller-manager")
}

// ControllerManager is a running kube-controller-manager.
type ControllerManager struct {
	// CAFile holds the PEM certificate of the CA it signs
	// kubernetes.io/kube-apiserver-client certificates with.
	CAFile string
}

// StartControllerManager runs kube-controller-manager against s with only its
// CSR signing controller (--controllers=certificatesigningrequest-signing-controller):
// it signs every approved CSR for KubeAPIServerClientSigner with signing (its
// certificate and key written to files, --cluster-signing-kube-apiserver-client-*-file).
// It returns once kcm's /healthz says ok (its controllers start with it); kcm
// stops when the test ends.
func (s *Server) StartControllerManager(t testing.TB, signing *testkit.Leaf) *ControllerManager {
	t.Helper()
	bin := ControllerManagerPath()
	if _, err := os.Stat(bin); err != nil {
		unavailable(t, "no kube-controller-manager at %s", bin)
	}
	s.Admin.Create(t, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "kubetest-kcm-certificate-controller"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:controller:certificate-controller"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KCMUser}},
	})
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: kcm
  user:
    token: %s
contexts:
- name: kcm
  context:
    cluster: kubetest
    user: kcm
current-context: kcm
`, s.URL, s.CAFile, kcmToken)
	m := &ControllerManager{CAFile: s.WriteFile(t, "kcm-signing.crt", signing.PEM())}
	keyFile := s.WriteFile(t, "kcm-signing.key", signing.KeyPEM(t))
	addr := testkit.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	start(t, s, "kube-controller-manager", bin,
		"--kubeconfig", s.WriteFile(t, "kcm.kubeconfig", kubeconfig),
		"--controllers", "certificatesigningrequest-signing-controller",
		"--cluster-signing-kube-apiserver-client-cert-file", m.CAFile,
		"--cluster-signing-kube-apiserver-client-key-file", keyFile,
		"--use-service-account-credentials=false",
		"--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", port,
		"--cert-dir", filepath.Join(s.Dir, "kcm-certs"),
		"--profiling=false",
		"--v=2")
	// Its serving certificate is self-signed (in --cert-dir): this probe trusts
	// it blindly, and only asks whether it is up.
	probe := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a local readiness probe
	defer probe.CloseIdleConnections()
	if !testkit.Poll(StartTimeout, func() bool {
		resp, err := probe.Get("https://" + addr + "/healthz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("kube-controller-manager not healthy after %s:\n%s", StartTimeout, s.Logs.String())
	}
	return m
}
