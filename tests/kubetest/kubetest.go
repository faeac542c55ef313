// Package kubetest starts a real Kubernetes API server for tests: Debian's etcd and
// a pinned kube-apiserver built from the Go module proxy by hack/kube-apiserver.sh,
// on loopback, with a service-account issuer and signing key (TokenRequest,
// TokenReview, OIDC discovery), a static admin token, RBAC and Pod Security
// admission. There is no kubelet, and no controller manager unless a test starts
// one (StartControllerManager: only its CSR signing controller): pods are never
// scheduled or run, namespaces are never emptied, and service accounts exist only
// when a test creates them.
//
// Tests that use it carry the build tag kube (make test-kube). Without the binary
// they skip, saying how to build it, unless MESHAGENT_REQUIRE_KUBE=1 makes them fail.
package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

// Version is the kube-apiserver release hack/kube-apiserver.sh builds.
const Version = "v1.34.2"

// AdminToken is the static token of the user admin (group system:masters).
const AdminToken = "meshagent-kubetest-admin"

// StartTimeout bounds etcd's and the API server's start (the API server's /readyz
// waits for its bootstrap RBAC roles and priority levels).
const StartTimeout = 90 * time.Second

// Server is a running etcd and kube-apiserver.
type Server struct {
	// URL is the API server, https://127.0.0.1:<port>; it is also the
	// service-account issuer (so its discovery document is <URL>/.well-known/openid-configuration).
	URL string
	// CAFile holds the PEM root of the API server's serving certificate.
	CAFile string
	// AdminTokenFile holds AdminToken.
	AdminTokenFile string
	// Admin is a client authenticated as admin (system:masters).
	Admin *Client
	// Dir is a temporary directory for the test's files.
	Dir  string
	Logs *testkit.Buffer // etcd's and the API server's output
	pool *x509.CertPool
}

// BinaryPath is where the kube-apiserver is: $MESHAGENT_KUBE_APISERVER, or in
// hack/kube-apiserver.sh's cache: $MESHAGENT_KUBE_CACHE, by default
// ${XDG_CACHE_HOME:-$HOME/.cache}/meshagent/kube-apiserver-<Version>/.
func BinaryPath() string {
	if p := os.Getenv("MESHAGENT_KUBE_APISERVER"); p != "" {
		return p
	}
	if dir := os.Getenv("MESHAGENT_KUBE_CACHE"); dir != "" {
		return filepath.Join(dir, "kube-apiserver")
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "meshagent", "kube-apiserver-"+Version, "kube-apiserver")
}

// unavailable skips t, or fails it when MESHAGENT_REQUIRE_KUBE=1.
func unavailable(t testing.TB, format string, a ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, a...) + " (build it with hack/kube-apiserver.sh, or run make test-kube)"
	if os.Getenv("MESHAGENT_REQUIRE_KUBE") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Start runs etcd and the API server for the test and stops both (removing their
// data) when it ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := BinaryPath()
	if _, err := os.Stat(bin); err != nil {
		unavailable(t, "no kube-apiserver at %s", bin)
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		unavailable(t, "no etcd in PATH (apt-get install etcd-server)")
	}
	dir := t.TempDir()
	s := &Server{Dir: dir, Logs: &testkit.Buffer{}}

	// etcd on two free loopback ports, its data in the test's directory.
	client, peer := testkit.FreeAddr(t), testkit.FreeAddr(t)
	start(t, s, "etcd", etcd,
		"--name", "kubetest", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "kubetest=http://"+peer, "--log-level", "warn")
	if !testkit.Poll(StartTimeout, func() bool {
		code, body := testkit.HTTPGet("http://" + client + "/health")
		return code == http.StatusOK && strings.Contains(body, "true")
	}) {
		t.Fatalf("etcd not healthy after %s:\n%s", StartTimeout, s.Logs.String())
	}

	// A serving certificate for 127.0.0.1 from a CA of the test's own, and the
	// service-account signing key.
	ca := testkit.SelfSigned(t, testkit.Spec{Name: "kubetest-ca", IsCA: true, Life: 24 * time.Hour})
	serving := ca.CA().Issue(t, testkit.Spec{Name: "kube-apiserver", DNS: []string{"localhost", "kubernetes.default.svc"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Life: 24 * time.Hour})
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		t.Fatal(err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"ca.crt":      ca.PEM(),
		"serving.crt": serving.PEM(),
		"serving.key": serving.KeyPEM(t),
		"sa.key":      string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saDER})),
		"sa.pub":      string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub})),
		"tokens.csv":  AdminToken + ",admin,admin-uid,system:masters\n" + kcmToken + "," + KCMUser + ",kcm-uid\n",
		"admin.token": AdminToken + "\n",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.CAFile, s.AdminTokenFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "admin.token")
	s.pool = x509.NewCertPool()
	s.pool.AddCert(ca.Cert)

	addr := testkit.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	s.URL = "https://" + addr
	start(t, s, "kube-apiserver", bin,
		"--etcd-servers", "http://"+client,
		"--bind-address", "127.0.0.1", "--secure-port", port, "--advertise-address", "127.0.0.1",
		"--cert-dir", filepath.Join(dir, "certs"),
		"--tls-cert-file", filepath.Join(dir, "serving.crt"), "--tls-private-key-file", filepath.Join(dir, "serving.key"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", s.URL,
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--api-audiences", s.URL,
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--enable-admission-plugins", "PodSecurity,NamespaceLifecycle,ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0")
	s.Admin = s.Client(AdminToken)
	if !testkit.Poll(StartTimeout, func() bool {
		code, _, err := s.Admin.Do(context.Background(), http.MethodGet, "/readyz", nil, "")
		return err == nil && code == http.StatusOK
	}) {
		t.Fatalf("kube-apiserver not ready after %s:\n%s", StartTimeout, s.Logs.String())
	}
	return s
}

// start runs a child process whose output goes to s.Logs (see Run).
func start(t testing.TB, s *Server, name, bin string, args ...string) {
	t.Helper()
	Run(t, s.Logs, name, exec.Command(bin, args...))
}

// Run starts cmd, its output into logs with each line prefixed by name, and stops
// it (SIGTERM, then SIGKILL) when the test ends; a process that exits by itself
// fails the test at its end, with the logs. Tests that run other servers beside
// the API server (istiod: tests/istiotest) start them with it.
func Run(t testing.TB, logs *testkit.Buffer, name string, cmd *exec.Cmd) {
	t.Helper()
	w := prefixWriter{prefix: name + ": ", buf: logs}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive a killed test binary
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
			if !t.Failed() {
				t.Errorf("%s exited during the test (%v):\n%s", name, cmd.ProcessState, logs.String())
			}
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(testkit.Timeout):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
}

type prefixWriter struct {
	prefix string
	buf    *testkit.Buffer
}

func (w prefixWriter) Write(p []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line != "" {
			_, _ = w.buf.Write([]byte(w.prefix + line))
		}
	}
	return len(p), nil
}

// Client is a client of the API server authenticated by a bearer token.
func (s *Server) Client(token string) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: s.pool, MinVersion: tls.VersionTLS12}
	return &Client{URL: s.URL, Token: token, HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// WriteFile writes data into a new file of the test's directory and returns its path.
func (s *Server) WriteFile(t testing.TB, name, data string) string {
	t.Helper()
	path := filepath.Join(s.Dir, name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
