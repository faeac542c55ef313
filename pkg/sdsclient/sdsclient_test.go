package sdsclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/meshagent/meshagent/tests/sdstest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// upstream is a real go-control-plane SDS server on a unix socket.
type upstream struct {
	path  string
	cache cachev3.SnapshotCache
	srv   *grpc.Server

	mu    sync.Mutex
	nacks []*discoveryv3.DiscoveryRequest
}

func startUpstream(t *testing.T, path string) *upstream {
	t.Helper()
	u := &upstream{path: path, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		if r.GetErrorDetail() != nil {
			u.mu.Lock()
			u.nacks = append(u.nacks, r)
			u.mu.Unlock()
		}
		return nil
	}}
	u.srv = grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(u.srv, serverv3.NewServer(ctx, u.cache, cb))
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go u.srv.Serve(lis)
	t.Cleanup(func() { u.srv.Stop(); cancel() })
	return u
}

func (u *upstream) set(t *testing.T, node, version string, secrets ...sdsclient.Secret) {
	t.Helper()
	var rs []types.Resource
	for _, s := range secrets {
		rs = append(rs, sdstest.EnvoySecret(s))
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.SecretType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

func (u *upstream) nackCount() int { u.mu.Lock(); defer u.mu.Unlock(); return len(u.nacks) }

func sockPath(t *testing.T) string {
	dir, err := os.MkdirTemp("", "ma")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "sds.sock")
}

// identity makes a root and a leaf under it, as PEM.
func identity(t *testing.T, cn string) (root, chain, key []byte) {
	t.Helper()
	ca := testkit.NewCA(t, "root-"+cn, nil, time.Now(), time.Hour)
	leaf := ca.Issue(t, testkit.Spec{Name: cn})
	return []byte(ca.PEM()), []byte(leaf.PEM() + ca.PEM()), []byte(leaf.KeyPEM(t))
}

func secrets(t *testing.T, cn string) (def, ca sdsclient.Secret) {
	root, chain, key := identity(t, cn)
	return sdsclient.Secret{Name: "default", CertChain: chain, PrivateKey: key}, sdsclient.Secret{Name: "ROOTCA", TrustedCA: root}
}

// served starts an upstream serving node the secrets of "one" at version v1 and
// dials it; the connection and its context (10 s at most) end with the test.
func served(t *testing.T, node string) (up *upstream, cc *grpc.ClientConn, ctx context.Context, def, ca sdsclient.Secret) {
	t.Helper()
	path := sockPath(t)
	up = startUpstream(t, path)
	def, ca = secrets(t, "one")
	up.set(t, node, "v1", def, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	cc, err := sdsclient.DialUnix(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return up, cc, ctx, def, ca
}

func TestStreamRecvAckAndPush(t *testing.T) {
	up, cc, ctx, d1, r1 := served(t, "node-a")
	st, err := sdsclient.Open(ctx, cc, "node-a", "default", "ROOTCA")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	u, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if u.Version != "v1" || u.Nonce == "" {
		t.Fatalf("version %q nonce %q", u.Version, u.Nonce)
	}
	if string(u.Secrets["default"].PrivateKey) != string(d1.PrivateKey) || string(u.Secrets["ROOTCA"].TrustedCA) != string(r1.TrustedCA) {
		t.Fatalf("secrets not as served: %+v", u.Secrets)
	}
	if !u.Secrets["default"].IsCertificate() || !u.Secrets["ROOTCA"].IsValidationContext() {
		t.Fatal("kinds not recognised")
	}

	d2, r2 := secrets(t, "two")
	up.set(t, "node-a", "v2", d2, r2)
	u, err = st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if u.Version != "v2" || string(u.Secrets["default"].CertChain) != string(d2.CertChain) {
		t.Fatalf("push not received: version %q", u.Version)
	}
}

func TestNackKeepsVersionAndServerSeesError(t *testing.T) {
	up, cc, ctx, _, _ := served(t, "node-n")
	st, err := sdsclient.Open(ctx, cc, "node-n", "default")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	resp, err := st.RecvRaw()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Nack(resp, "bad key"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the server to see the NACK", func() bool { return up.nackCount() == 1 })
	up.mu.Lock()
	n := up.nacks[0]
	up.mu.Unlock()
	if n.GetResponseNonce() != resp.Nonce || n.GetVersionInfo() != "" || n.GetErrorDetail().GetMessage() != "bad key" {
		t.Fatalf("nack request = %v", n)
	}
}

func TestFetch(t *testing.T) {
	_, cc, ctx, _, r1 := served(t, "node-f")
	got, err := sdsclient.Fetch(ctx, cc, "node-f", "ROOTCA")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got["ROOTCA"].TrustedCA) != string(r1.TrustedCA) {
		t.Fatalf("fetch = %+v", got)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := sdsclient.DialUnix(ctx, ""); err == nil {
		t.Error("DialUnix with empty path: want error")
	}
	cc, err := sdsclient.DialUnix(ctx, "/nonexistent/sock")
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := sdsclient.Open(ctx, cc, ""); err == nil {
		t.Error("Open with empty node id: want error")
	}
	if _, err := sdsclient.Decode(&xdswire.DiscoveryResponse{TypeURL: "type.googleapis.com/x.Y"}); err == nil {
		t.Error("Decode of another type: want error")
	}
}

func TestWatcherFollowsUpdatesAndReconnects(t *testing.T) {
	path := sockPath(t)
	up := startUpstream(t, path)
	d1, r1 := secrets(t, "one")
	up.set(t, "node-w", "v1", d1, r1)
	ctx, cancel := context.WithCancel(context.Background())
	cc, _ := sdsclient.DialUnix(ctx, path)
	defer cc.Close()
	w := sdsclient.NewWatcher(cc, "node-w", nil)
	if _, err := w.Certificate(); err != sdsclient.ErrNotReady {
		t.Fatalf("before run: %v", err)
	}
	changed := w.Changed()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-w.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher not ready")
	}
	<-changed
	c, err := w.Certificate()
	if err != nil || c.Leaf.Subject.CommonName != "one" {
		t.Fatalf("certificate %v %v", c, err)
	}
	pool, err := w.Roots()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		t.Fatalf("leaf does not verify against ROOTCA: %v", err)
	}

	// A push reaches the watcher.
	changed = w.Changed()
	d2, r2 := secrets(t, "two")
	up.set(t, "node-w", "v2", d2, r2)
	<-changed
	testkit.Eventually(t, "the watcher to take the push", func() bool {
		c, _ := w.Certificate()
		return c.Leaf.Subject.CommonName == "two"
	})

	// The server restarts on the same socket: the watcher reconnects.
	up.srv.Stop()
	os.Remove(path)
	up2 := startUpstream(t, path)
	d3, r3 := secrets(t, "three")
	up2.set(t, "node-w", "v3", d3, r3)
	testkit.Eventually(t, "the watcher to reconnect and take the new server's secret", func() bool {
		c, _ := w.Certificate()
		return c.Leaf.Subject.CommonName == "three"
	})
	// The tls.Config hooks serve the current certificate.
	tc, err := w.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || tc.Leaf.Subject.CommonName != "three" {
		t.Fatalf("GetClientCertificate = %v, %v", tc, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil on cancel", err)
	}
}

func TestWatcherNacksBadCertificate(t *testing.T) {
	path := sockPath(t)
	up := startUpstream(t, path)
	d1, r1 := secrets(t, "one")
	d1.PrivateKey = []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	up.set(t, "node-x", "v1", d1, r1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc, _ := sdsclient.DialUnix(ctx, path)
	defer cc.Close()
	w := sdsclient.NewWatcher(cc, "node-x", nil)
	go w.Run(ctx)
	testkit.Eventually(t, "the server to see the NACK", func() bool { return up.nackCount() >= 1 })
	if _, err := w.Certificate(); err != sdsclient.ErrNotReady {
		t.Fatalf("bad certificate installed: %v", err)
	}
}

func TestDeltaStream(t *testing.T) {
	_, cc, ctx, d1, _ := served(t, "node-d")
	ds, err := sdsclient.OpenDelta(ctx, cc, "node-d", "default")
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	u, err := ds.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if string(u.Secrets["default"].CertChain) != string(d1.CertChain) || u.Versions["default"] == "" {
		t.Fatalf("delta update = %+v", u)
	}
}

// WatchUnix dials in Run, so it may start before the server, and closes its
// connection when Run returns (TestMain checks for leaks).
func TestWatchUnixDialsInRunAndClosesOnReturn(t *testing.T) {
	path := sockPath(t)
	w := sdsclient.WatchUnix(path, "node-u", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	up := startUpstream(t, path)
	d1, r1 := secrets(t, "one")
	up.set(t, "node-u", "v1", d1, r1)
	testkit.Eventually(t, "the watcher to reach the late server", func() bool {
		c, err := w.Certificate()
		return err == nil && c.Leaf.Subject.CommonName == "one"
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil on cancel", err)
	}
}
