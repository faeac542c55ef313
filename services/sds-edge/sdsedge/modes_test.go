package sdsedge_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestExistingSDSServerMeansExternalMode(t *testing.T) {
	v := newEnv(t)
	up := bustest.Record(t, v.nc, events.PodEventWildcard(events.PodEventUp))
	root := testkit.ShortDir(t)
	sock := filepath.Join(root, "sds.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	other := grpc.NewServer() // another provider (SPIRE, say)
	go other.Serve(lis)
	defer other.Stop()

	p := v.startPod(podOpt{root: root})
	if p.e.Mode() != "external" {
		t.Fatalf("mode %q, want external", p.e.Mode())
	}
	if err := p.e.Ready(); err != nil {
		t.Fatalf("external mode not ready: %v", err)
	}
	testkit.Eventually(t, "pod.up external", func() bool {
		return len(bustest.Find(up, func(e events.PodUp) bool { return e.Mode == "external" })) == 1
	})
	if c, err := net.Dial("unix", sock); err != nil {
		t.Fatalf("the other provider's socket was disturbed: %v", err)
	} else {
		c.Close()
	}
	if v.ca.requests.Load() != 0 {
		t.Fatal("asked the CA in external mode")
	}
}

func TestStaleSocketIsRemoved(t *testing.T) {
	v := newEnv(t)
	root := testkit.ShortDir(t)
	sock := filepath.Join(root, "sds.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close() // the file stays; nothing answers
	if _, err := os.Stat(sock); err != nil {
		t.Fatal(err)
	}
	p := v.startPod(podOpt{root: root})
	if p.e.Mode() != "ca" {
		t.Fatalf("mode %q, want ca", p.e.Mode())
	}
	st := p.open(t, p.dial(t), "default")
	if !recv(t, st).Secrets["default"].IsCertificate() {
		t.Fatal("no certificate after replacing a stale socket")
	}
}

// writeK8sSecretDir lays out files as the kubelet does: files are symlinks into
// ..data, which points at a timestamped directory; an update swaps ..data atomically.
func writeK8sSecretDir(t *testing.T, dir, gen string, files map[string][]byte) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_"+gen)
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(ts, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, n)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", n), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// credFiles issues a certificate from ca for an identity and returns the three files.
func credFiles(t *testing.T, c *testCA, sa string) map[string][]byte {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := pki.NewCSR(k, "spiffe://cluster.local/ns/default/sa/"+sa)
	chain, err := c.sign(csr, "spiffe://cluster.local/ns/default/sa/"+sa, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pki.EncodeKeyPEM(k, true)
	return map[string][]byte{"cert-chain.pem": []byte(chain[0] + chain[1]), "key.pem": key, "root-cert.pem": []byte(c.bundle()[0])}
}

func TestFileMountedCertsFollowSymlinkSwap(t *testing.T) {
	for _, tc := range []struct {
		name string
		dir  string
		args []string
	}{
		{"workload-spiffe-credentials", "var/run/secrets/workload-spiffe-credentials", nil},
		{"FILE_MOUNTED_CERTS", "etc/certs", []string{"-file-mounted-certs", "-file-debounce", "20ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			root := testkit.ShortDir(t)
			dir := filepath.Join(root, tc.dir)
			writeK8sSecretDir(t, dir, "1", credFiles(t, v.ca, "one"))
			p := v.startPod(podOpt{root: root, noTok: true, args: tc.args})
			if p.e.Mode() != "file" {
				t.Fatalf("mode %q, want file", p.e.Mode())
			}
			cc := p.dial(t)
			st := p.open(t, cc, "default")
			if id := leafOf(t, recv(t, st).Secrets["default"]).URIs[0].String(); id != "spiffe://cluster.local/ns/default/sa/one" {
				t.Fatalf("served %s", id)
			}
			if got, err := sdsclient.Fetch(context.Background(), cc, "n", "ROOTCA"); err != nil || !got["ROOTCA"].IsValidationContext() {
				t.Fatalf("ROOTCA from files: %v", err)
			}
			writeK8sSecretDir(t, dir, "2", credFiles(t, v.ca, "two"))
			if id := leafOf(t, recv(t, st).Secrets["default"]).URIs[0].String(); id != "spiffe://cluster.local/ns/default/sa/two" {
				t.Fatalf("after swap served %s", id)
			}
			testkit.Eventually(t, "ready", func() bool { return p.e.Ready() == nil })
			if v.ca.requests.Load() != 0 {
				t.Fatal("asked the CA in file mode")
			}
		})
	}
}

func TestFileResources(t *testing.T) {
	v := newEnv(t)
	root := testkit.ShortDir(t)
	p := v.startPod(podOpt{root: root, args: []string{"-file-debounce", "10ms"}})
	// A DestinationRule's client certificate, mounted under /etc/certs.
	dir := filepath.Join(root, "etc/certs/client")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := credFiles(t, v.ca, "files")
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	certName := "file-cert:" + filepath.Join(dir, "cert-chain.pem") + "~" + filepath.Join(dir, "key.pem")
	rootName := "file-root:" + filepath.Join(dir, "root-cert.pem")
	st := p.open(t, p.dial(t), certName, rootName)
	u := recv(t, st)
	if !u.Secrets[certName].IsCertificate() || !u.Secrets[rootName].IsValidationContext() {
		t.Fatalf("file resources = %v", u.Secrets)
	}
	// Rewriting the root file in place pushes it.
	other := newTestCA(t)
	if err := os.WriteFile(filepath.Join(dir, "root-cert.pem"), []byte(other.bundle()[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	u = recv(t, st)
	certs, _ := pki.ParseCertsPEM(u.Secrets[rootName].TrustedCA)
	if len(certs) != 1 || !certs[0].Equal(other.roots[0]) {
		t.Fatal("file-root not reloaded")
	}
	// A broken key file keeps the old secret.
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := sdsclient.Fetch(context.Background(), p.dial(t), "n", certName)
	if err != nil || !got[certName].IsCertificate() {
		t.Fatalf("after a broken write: %v", err)
	}
}

// file-cert:/file-root: names come from the proxy's configuration, i.e. from
// whoever may write a DestinationRule or a Gateway. In the local stack sds-edge can
// read the signers' CA keys, so a name for a CA certificate and its key would
// serve the CA's private key to Envoy. Only files under -file-cert-dirs (default:
// Istio's mounted-cert directories under the pod root) are served: a path outside
// them, a way out through "..", a symlink pointing out (file or directory) gets
// NotFound saying so, and nothing is served.
func TestFileResourcesAreConfined(t *testing.T) {
	v := newEnv(t)
	root := testkit.ShortDir(t)
	p := v.startPod(podOpt{root: root})
	// Outside the pod: a CA's certificate and key (the stack's secrets directory).
	outside := testkit.ShortDir(t)
	ca := credFiles(t, v.ca, "the-ca")
	caCert, caKey := filepath.Join(outside, "ca-cert.pem"), filepath.Join(outside, "ca-key.pem")
	for f, b := range map[string][]byte{caCert: ca["cert-chain.pem"], caKey: ca["key.pem"], filepath.Join(outside, "root-cert.pem"): ca["root-cert.pem"]} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	certs := filepath.Join(root, "etc/certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"evil-cert.pem": caCert, "evil-key.pem": caKey, "evil-dir": outside} {
		if err := os.Symlink(target, filepath.Join(certs, link)); err != nil {
			t.Fatal(err)
		}
	}
	up, err := filepath.Rel(certs, outside)
	if err != nil {
		t.Fatal(err)
	}
	fromRoot, _ := filepath.Rel(root, outside)
	cc := p.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct{ name, resource string }{
		{"absolute path outside", "file-cert:" + caCert + "~" + caKey},
		{"relative path outside the pod root", "file-cert:" + filepath.Join(fromRoot, "ca-cert.pem") + "~" + filepath.Join(fromRoot, "ca-key.pem")},
		{"../ out of /etc/certs", "file-cert:" + filepath.Join(certs, "x") + "/../" + filepath.Join(up, "ca-cert.pem") + "~" + certs + "/../" + filepath.Join(up, "ca-key.pem")},
		{"symlinks in /etc/certs to files outside", "file-cert:" + filepath.Join(certs, "evil-cert.pem") + "~" + filepath.Join(certs, "evil-key.pem")},
		{"symlinked directory", "file-cert:" + filepath.Join(certs, "evil-dir/ca-cert.pem") + "~" + filepath.Join(certs, "evil-dir/ca-key.pem")},
		{"file-root outside", "file-root:" + filepath.Join(outside, "root-cert.pem")},
		{"file-root through a symlinked directory", "file-root:" + filepath.Join(certs, "evil-dir/root-cert.pem")},
		{"a file that does not exist, outside", "file-root:/no/such/dir/root-cert.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := sdsclient.Open(ctx, cc, "n", "default", tc.resource)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			u, err := st.Recv()
			if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "outside the directories") {
				t.Fatalf("stream: %v, want NotFound saying the path is outside", err)
			}
			if len(u.Secrets) != 0 {
				t.Fatalf("served %v", u.Secrets)
			}
			got, err := sdsclient.Fetch(ctx, cc, "n", tc.resource)
			if status.Code(errors.Unwrap(err)) != codes.NotFound || len(got) != 0 {
				t.Fatalf("fetch: %v %v", got, err)
			}
		})
	}
	// The pod's own identity is still served.
	if _, err := sdsclient.Fetch(ctx, cc, "n", "default"); err != nil {
		t.Fatalf("default after the refusals: %v", err)
	}
	// The knob: with the outside directory allowed, the same name is served, so
	// the refusals above were the confinement and not a broken path.
	q := v.startPod(podOpt{args: []string{"-file-cert-dirs", outside}})
	name := "file-cert:" + caCert + "~" + caKey
	got, err := sdsclient.Fetch(ctx, q.dial(t), "n", name)
	if err != nil || !got[name].IsCertificate() {
		t.Fatalf("with -file-cert-dirs %s: %v %v", outside, got, err)
	}
}

func TestSocketModeAndPodDown(t *testing.T) {
	v := newEnv(t)
	down := bustest.Record(t, v.nc, events.PodEventWildcard(events.PodEventDown))
	root := testkit.ShortDir(t)
	p := v.startPod(podOpt{root: root, args: []string{"-socket", "deep/er/sds.sock", "-socket-mode", "0660"}})
	fi, err := os.Stat(filepath.Join(root, "deep/er/sds.sock"))
	if err != nil || fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v %v, want a 0660 socket with its parent dirs created", fi, err)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "pod.down published", func() bool {
		return len(bustest.Find(down, func(e events.PodDown) bool { return e.Pod == testPodRef })) == 1
	})
	if _, err := os.Stat(filepath.Join(root, "deep/er/sds.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left behind after shutdown: %v", err)
	}
}

func TestExternalWaitSeesSlowProvider(t *testing.T) {
	v := newEnv(t)
	root := testkit.ShortDir(t)
	sock := filepath.Join(root, "sds.sock")
	other := grpc.NewServer()
	defer other.Stop()
	go func() {
		time.Sleep(300 * time.Millisecond) // a provider that starts slowly
		lis, err := net.Listen("unix", sock)
		if err != nil {
			t.Error(err)
			return
		}
		_ = other.Serve(lis)
	}()
	p := v.startPod(podOpt{root: root, args: []string{"-external-wait", "5s"}})
	if p.e.Mode() != "external" {
		t.Fatalf("mode %q, want external", p.e.Mode())
	}
}
