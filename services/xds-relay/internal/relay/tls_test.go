package relay_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/xds-relay/internal/tlsrefresh"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/sdstest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const workloadID = "spiffe://cluster.local/ns/default/sa/web"

// startSDS serves `default` and `ROOTCA` for node with a real go-control-plane SDS
// server on a unix socket, as sds-edge does.
// The returned func serves a new workload certificate (a rotation).
func startSDS(t testing.TB, nodeID string, workload tls.Certificate, roots ...*x509.Certificate) (string, func(tls.Certificate)) {
	t.Helper()
	sc := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	version := 0
	set := func(w tls.Certificate) {
		keyPEM, err := pki.EncodeKeyPEM(w.PrivateKey.(crypto.Signer), true)
		if err != nil {
			t.Fatal(err)
		}
		version++
		snap, err := cache.NewSnapshot(strconv.Itoa(version), map[resource.Type][]types.Resource{resource.SecretType: {
			sdstest.EnvoySecret(sdsclient.Secret{Name: "default", CertChain: pki.EncodeCertPEM(w.Leaf), PrivateKey: keyPEM}),
			sdstest.EnvoySecret(sdsclient.Secret{Name: "ROOTCA", TrustedCA: pki.EncodeCertsPEM(roots)}),
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := sc.SetSnapshot(context.Background(), nodeID, snap); err != nil {
			t.Fatal(err)
		}
	}
	set(workload)
	path := filepath.Join(testkit.ShortDir(t), "sds")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(gs, xdsserver.NewServer(context.Background(), sc, nil))
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return path, set
}

// watchSDS follows the SDS server at path as node, as xds-relay follows
// sds-edge, until the test ends; it returns once the first secrets are in.
func watchSDS(t testing.TB, path, node string) *sdsclient.Watcher {
	t.Helper()
	w := sdsclient.WatchUnix(path, node, testLog(t))
	testkit.Background(t, func(ctx context.Context) error { _ = w.Run(ctx); return nil })
	select {
	case <-w.Ready():
	case <-time.After(testkit.Timeout):
		t.Fatal("sds watcher not ready")
	}
	return w
}

func TestMTLSUpstreamWithSDSCertAndTrustChange(t *testing.T) {
	ca1, ca2 := testkit.NewCA(t, "root 1", nil, time.Now(), time.Hour), testkit.NewCA(t, "root 2", nil, time.Now(), time.Hour)
	var serverCert atomic.Pointer[tls.Certificate]
	c1 := ca1.Issue(t, testkit.Spec{DNS: []string{"xds.test"}}).TLS()
	serverCert.Store(&c1)
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(ca1.Cert)
	up := startUpstream(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serverCert.Load(), nil },
		ClientAuth:     tls.RequireAndVerifyClientCert, ClientCAs: clientCAs,
	})))
	var mu sync.Mutex
	var peers, serials []string
	up.mu.Lock()
	up.onOpen = func(ctx context.Context) {
		p, _ := peer.FromContext(ctx)
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			mu.Lock()
			peers = append(peers, ti.State.PeerCertificates[0].URIs[0].String())
			serials = append(serials, pki.SerialHex(ti.State.PeerCertificates[0]))
			mu.Unlock()
		}
	}
	up.mu.Unlock()
	up.setClusters("n1", "v1", "a")

	const nodeID = "xds-relay~" + testPod
	sdsPath, rotate := startSDS(t, nodeID, ca1.Issue(t, testkit.Spec{ID: workloadID}).TLS(), ca1.Cert)
	w := watchSDS(t, sdsPath, nodeID)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	env := startRelay(t, upstream.Config{Address: up.addr, Mode: upstream.MTLS, ServerName: "xds.test"}, w)
	wg.Add(1)
	go func() { defer wg.Done(); _ = tlsrefresh.New(env.nc, env.dialer, w, w, testLog(t)).Run(ctx) }()
	client := ads(t, env.socket)
	open := func() (discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, *discoveryv3.DiscoveryResponse, error) {
		st, err := client.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node("n1"), TypeUrl: resource.ClusterType}); err != nil {
			return st, nil, err
		}
		r, err := st.Recv()
		return st, r, err
	}

	// mTLS: the upstream sees the workload identity from sds-edge.
	stA, rA, err := open()
	if err != nil {
		t.Fatalf("mtls stream: %v", err)
	}
	mu.Lock()
	gotPeers := append([]string(nil), peers...)
	mu.Unlock()
	if len(gotPeers) != 1 || gotPeers[0] != workloadID {
		t.Fatalf("upstream saw client identities %v, want [%s]", gotPeers, workloadID)
	}

	// The upstream moves to a certificate from a new root. Streams share the
	// connection, so only a rebuild makes the relay handshake again: a reload
	// without the new root (generation 2) fails new streams; a bundle bringing the
	// new root that no trusted root endorsed (generation 3: unendorsed, or endorsed
	// by the new root's own key) is refused and changes nothing; the rotation that
	// brings it endorsed by the trusted root (generation 4) lets them through.
	c2 := ca2.Issue(t, testkit.Spec{DNS: []string{"xds.test"}}).TLS()
	serverCert.Store(&c2)
	publishTrust := func(gen uint64, by []crypto.Signer, roots ...*x509.Certificate) {
		ev := events.TrustChanged{TrustDomain: "cluster.local", Roots: pki.CertPEMs(roots),
			Reason: events.TrustReasonRotation, Generation: gen}
		var err error
		if ev.Endorsements, err = trustbundle.Endorse(ev.TrustDomain, gen, ev.Roots, by...); err != nil {
			t.Fatal(err)
		}
		msg, err := events.NewMsg(events.SubjectTrustChanged, "signer", ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := env.nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	publishTrust(2, []crypto.Signer{ca1.Key}, ca1.Cert)
	testkit.Eventually(t, "new stream rejects the untrusted upstream", func() bool {
		_, _, err := open()
		return status.Code(err) == codes.Unavailable
	})
	publishTrust(3, nil, ca2.Cert, ca1.Cert)
	publishTrust(3, []crypto.Signer{ca2.Key}, ca2.Cert, ca1.Cert)
	if testkit.Poll(time.Second, func() bool { _, _, err := open(); return err == nil }) {
		t.Fatal("the relay trusted a root from a trust.changed no trusted root endorsed")
	}
	publishTrust(4, []crypto.Signer{ca1.Key}, ca2.Cert, ca1.Cert)
	testkit.Eventually(t, "new stream trusts the new root", func() bool {
		_, r, err := open()
		return err == nil && r.GetVersionInfo() == "v1"
	})

	// The stream opened before the change runs on.
	if err := stA.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: rA.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	up.setClusters("n1", "v2", "a", "b")
	if r, err := stA.Recv(); err != nil || r.GetVersionInfo() != "v2" {
		t.Fatalf("old stream after trust change: %v %v", r.GetVersionInfo(), err)
	}

	// sds-edge rotates the workload certificate: new upstream streams present it.
	rotated := ca1.Issue(t, testkit.Spec{ID: workloadID}).TLS()
	rotate(rotated)
	want := pki.SerialHex(rotated.Leaf)
	testkit.Eventually(t, "rotated workload certificate reaches the upstream", func() bool {
		if _, _, err := open(); err != nil {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return serials[len(serials)-1] == want
	})
}
