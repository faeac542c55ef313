package sdsedge_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/sdsedge"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
)

const gatewayNode = "router~10.0.0.9~ingress-0.istio-system~istio-system.svc.cluster.local"

// mountSecret lays out a secret directory as the kubelet does: the files in a
// timestamped directory, ..data a symlink to it, and each name a symlink into
// ..data; a later call swaps ..data atomically (rename over the link).
func mountSecret(t *testing.T, dir, version string, files map[string]string) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_"+version)
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
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

func dialSocket(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	cc, err := sdsclient.DialUnix(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func fetch(cc grpc.ClientConnInterface, names ...string) (map[string]sdsclient.Secret, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return sdsclient.Fetch(ctx, cc, gatewayNode, names...)
}

func TestGatewayCredentialsServedByNameApartFromTheWorkload(t *testing.T) {
	v := newEnv(t)
	root := testkit.ShortDir(t)
	ca := testkit.NewCA(t, "gateway-ca", nil, time.Now(), 24*time.Hour)
	leaf1 := ca.Issue(t, testkit.Spec{DNS: []string{"shop.example.com"}})
	mountSecret(t, filepath.Join(root, "gw", "ingress-cert"), "a",
		map[string]string{"tls.crt": leaf1.PEM(), "tls.key": leaf1.KeyPEM(t), "ca.crt": ca.PEM()})
	other := ca.Issue(t, testkit.Spec{DNS: []string{"api.example.com"}})
	mountSecret(t, filepath.Join(root, "gw", "payments", "api-cert"), "a",
		map[string]string{"cert": other.PEM(), "key": other.KeyPEM(t)})

	p := v.startPod(podOpt{root: root, args: []string{"-gateway-credentials-dir", "gw", "-credential-socket", "cred.sock", "-file-debounce", "20ms"}})
	gw := dialSocket(t, filepath.Join(root, "cred.sock"))
	var got map[string]sdsclient.Secret
	testkit.Eventually(t, "the credential socket to answer", func() bool {
		var err error
		got, err = fetch(gw, "kubernetes://ingress-cert", "kubernetes://ingress-cert-cacert", "kubernetes://payments/api-cert")
		return err == nil
	})
	if s := got["kubernetes://ingress-cert"]; !s.IsCertificate() || leafOf(t, s).SerialNumber.Cmp(leaf1.Cert.SerialNumber) != 0 {
		t.Fatalf("kubernetes://ingress-cert: got %+v, want the mounted tls.crt and tls.key", s)
	}
	if s := got["kubernetes://ingress-cert-cacert"]; !s.IsValidationContext() || string(s.TrustedCA) != ca.PEM() {
		t.Fatalf("kubernetes://ingress-cert-cacert: want ca.crt as a validation context, got %+v", s)
	}
	if s := got["kubernetes://payments/api-cert"]; leafOf(t, s).SerialNumber.Cmp(other.Cert.SerialNumber) != 0 {
		t.Fatal("kubernetes://payments/api-cert: want the namespaced secret's cert/key files")
	}

	// Refusals: clear, counted, and nothing of the workload identity through here.
	for _, c := range []struct{ name, want, reason string }{
		{"default", "want kubernetes://", ""},
		{"ROOTCA", "want kubernetes://", ""},
		{"kubernetes://absent", "no secret directory", "absent"},
		{"kubernetes://../gw", "not a Kubernetes object name", "bad_name"},
		{"kubernetes://a/b/c", "want <secret> or <namespace>/<secret>", "bad_name"},
	} {
		_, err := fetch(gw, c.name)
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), c.want) {
			t.Errorf("fetch %q on the credential socket: got %v, want NotFound saying %q", c.name, err, c.want)
		}
	}
	if n := obstest.Metric(t, p.reg, "meshagent_sds_edge_gateway_credential_refusals_total", map[string]string{"reason": "bad_name"}); n != 2 {
		t.Errorf("bad_name refusals: got %v, want 2", n)
	}
	if n := obstest.Metric(t, p.reg, "meshagent_sds_edge_gateway_credential_refusals_total", map[string]string{"reason": "absent"}); n != 1 {
		t.Errorf("absent refusals: got %v, want 1", n)
	}
	// ... and no gateway credential through the workload's socket.
	if _, err := fetch(p.dial(t), "kubernetes://ingress-cert"); status.Code(err) != codes.NotFound {
		t.Errorf("kubernetes://ingress-cert on the workload socket: got %v, want NotFound", err)
	}

	// A stream gets the credential, then the new one when the secret is swapped.
	st, err := sdsclient.Open(context.Background(), gw, gatewayNode, "kubernetes://ingress-cert")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	first := recv(t, st)
	if leafOf(t, first.Secrets["kubernetes://ingress-cert"]).SerialNumber.Cmp(leaf1.Cert.SerialNumber) != 0 {
		t.Fatal("stream: first response is not the mounted certificate")
	}
	leaf2 := ca.Issue(t, testkit.Spec{DNS: []string{"shop.example.com"}})
	mountSecret(t, filepath.Join(root, "gw", "ingress-cert"), "b",
		map[string]string{"tls.crt": leaf2.PEM(), "tls.key": leaf2.KeyPEM(t), "ca.crt": ca.PEM()})
	if u := recv(t, st); leafOf(t, u.Secrets["kubernetes://ingress-cert"]).SerialNumber.Cmp(leaf2.Cert.SerialNumber) != 0 {
		t.Fatal("after the ..data swap the stream did not get the new certificate")
	}

	// A swap to files that do not load (a key of another certificate) is refused:
	// the last good credential stays served; the next good swap is pushed.
	leaf3 := ca.Issue(t, testkit.Spec{DNS: []string{"shop.example.com"}})
	mountSecret(t, filepath.Join(root, "gw", "ingress-cert"), "c",
		map[string]string{"tls.crt": leaf3.PEM(), "tls.key": other.KeyPEM(t), "ca.crt": ca.PEM()})
	testkit.Eventually(t, "the bad swap to be seen and refused", func() bool {
		return strings.Contains(p.logs(), "keeping previous secret")
	})
	got, err = fetch(gw, "kubernetes://ingress-cert")
	if err != nil || leafOf(t, got["kubernetes://ingress-cert"]).SerialNumber.Cmp(leaf2.Cert.SerialNumber) != 0 {
		t.Fatalf("after a bad swap: got %v, want the last good certificate", err)
	}
	leaf4 := ca.Issue(t, testkit.Spec{DNS: []string{"shop.example.com"}})
	mountSecret(t, filepath.Join(root, "gw", "ingress-cert"), "d",
		map[string]string{"tls.crt": leaf4.PEM(), "tls.key": leaf4.KeyPEM(t), "ca.crt": ca.PEM()})
	if u := recv(t, st); leafOf(t, u.Secrets["kubernetes://ingress-cert"]).SerialNumber.Cmp(leaf4.Cert.SerialNumber) != 0 {
		t.Fatalf("after a good swap following a bad one the stream got %v", u.Secrets)
	}
}

func TestGatewayCredentialSocketMustNotBeTheWorkloadSocket(t *testing.T) {
	_, err := sdsedge.Load([]string{"-pod", testPod, "-gateway-credentials-dir", "gw", "-socket", "s.sock", "-credential-socket", "s.sock"},
		func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "-credential-socket: must not be the workload's -socket") {
		t.Fatalf("got %v", err)
	}
}
