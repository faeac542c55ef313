package launcher_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/launcher/internal/standin"
	"github.com/meshagent/meshagent/services/launcher/launcher"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/sdstest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
)

// standinEnv makes this test binary the Envoy stand-in when the launcher starts it:
// the launcher execs the test binary exactly as it execs Envoy.
const standinEnv = "MESHAGENT_TEST_ENVOY_STANDIN"

func TestMain(m *testing.M) {
	if os.Getenv(appEnv) == "1" {
		os.Exit(proxylessApp())
	}
	if os.Getenv(standinEnv) == "1" {
		os.Exit(standin.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Setenv(standinEnv, "1") // for the children only
	os.Exit(m.Run())
}

const podID = "web-0"

// anyNode keys every node to one snapshot: the launcher's gate and the stand-in
// ask with different node ids.
type anyNode struct{}

func (anyNode) ID(*corev3.Node) string { return "pod" }

// pod is one pod around the launcher: a real go-control-plane SDS server (sds-edge's
// place: its secrets come when the test says, as from a slow signer), a real ADS
// server on the xDS socket, the relay's readiness on a real pkg/obs server, and a
// real embedded NATS for the events.
type pod struct {
	t          *testing.T
	dir        string
	sdsSocket  string
	xdsSocket  string
	sds        cachev3.SnapshotCache
	ads        cachev3.SnapshotCache // what the "relay" serves: empty by default
	relayReady atomic.Bool
	relayURL   string
	sdsHeld    atomic.Bool // sds-edge's store holds default and ROOTCA
	sdsExpired atomic.Bool // sds-edge serves an expired default
	sdsURL     string
	nc         *nats.Conn
	log        testkit.Buffer    // the launcher's log
	env        map[string]string // the launcher's environment; nil: empty
	mu         sync.Mutex
	seen       []events.Payload
}

func newPod(t *testing.T) *pod {
	t.Helper()
	p := &pod{t: t, dir: testkit.ShortDir(t)}
	p.sdsSocket = filepath.Join(p.dir, "sds.sock")
	p.xdsSocket = filepath.Join(p.dir, "XDS")
	p.sds = cachev3.NewSnapshotCache(false, anyNode{}, nil)
	p.serve(p.sdsSocket, func(s *grpc.Server, ctx context.Context) {
		secretv3.RegisterSecretDiscoveryServiceServer(s, serverv3.NewServer(ctx, p.sds, nil))
	})
	p.ads = cachev3.NewSnapshotCache(false, anyNode{}, nil)
	p.setConfig(map[resource.Type][]types.Resource{resource.ClusterType: {}, resource.ListenerType: {}})
	p.serve(p.xdsSocket, func(s *grpc.Server, ctx context.Context) {
		discoveryv3.RegisterAggregatedDiscoveryServiceServer(s, serverv3.NewServer(ctx, p.ads, nil))
	})
	relay := obs.NewServer("127.0.0.1:0", hclog.NewNullLogger())
	// xds-relay's own check, as it words it (upstream.Reachability).
	relay.AddReadyCheck("upstream", func() error {
		if !p.relayReady.Load() {
			return errors.New("istiod.istio-system.svc:15012 not reachable (TRANSIENT_FAILURE)")
		}
		return nil
	})
	run(t, relay.Run)
	<-relay.Bound()
	p.relayURL = "http://" + relay.Addr().String() + "/readyz"
	// sds-edge's readiness as it words it (sdsedge.Edge.Ready): the gate asks this,
	// not the SDS socket, which it only dials.
	edge := obs.NewServer("127.0.0.1:0", hclog.NewNullLogger())
	edge.AddReadyCheck("secrets", func() error {
		if !p.sdsHeld.Load() {
			return errors.Join(errors.New("default not available yet"), errors.New("ROOTCA not available yet"))
		}
		if p.sdsExpired.Load() {
			return errors.New("serving an expired certificate: 5eed expired at 2026-01-01T00:00:00Z (3 signing attempts failed since; last: signer unreachable)")
		}
		return nil
	})
	run(t, edge.Run)
	<-edge.Bound()
	p.sdsURL = "http://" + edge.Addr().String() + "/readyz"

	ns := bustest.Server(t)
	p.nc = bustest.Conn(t, ns)
	if _, err := bus.EnsureEventStream(context.Background(), bustest.JetStream(t, p.nc), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	subj, _ := events.PodEventsOf(events.PodRef{Namespace: "default", Name: podID})
	if _, err := p.nc.Subscribe(subj, func(m *nats.Msg) {
		pl, _, err := events.DecodeAny(m)
		if err != nil {
			t.Errorf("event on %s: %v", m.Subject, err)
			return
		}
		p.mu.Lock()
		p.seen = append(p.seen, pl)
		p.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pod) serve(path string, register func(*grpc.Server, context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	s := grpc.NewServer()
	register(s, ctx)
	ln, err := net.Listen("unix", path)
	if err != nil {
		p.t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	p.t.Cleanup(func() { s.Stop(); cancel() })
}

// setConfig sets what the control plane behind the relay serves.
func (p *pod) setConfig(rs map[resource.Type][]types.Resource) {
	p.t.Helper()
	snap, err := cachev3.NewSnapshot("1", rs)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.ads.SetSnapshot(context.Background(), "pod", snap); err != nil {
		p.t.Fatal(err)
	}
}

// giveSecrets is sds-edge getting its certificate from the signer at last.
func (p *pod) giveSecrets() {
	p.t.Helper()
	root, chain, key := identity(p.t)
	snap, err := cachev3.NewSnapshot("1", map[resource.Type][]types.Resource{resource.SecretType: {
		sdstest.EnvoySecret(sdsclient.Secret{Name: "default", CertChain: chain, PrivateKey: key}),
		sdstest.EnvoySecret(sdsclient.Secret{Name: "ROOTCA", TrustedCA: root}),
	}})
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.sds.SetSnapshot(context.Background(), "pod", snap); err != nil {
		p.t.Fatal(err)
	}
	p.sdsHeld.Store(true)
}

// args are the launcher's flags for this pod; more override them.
func (p *pod) args(more ...string) []string {
	exe, err := os.Executable()
	if err != nil {
		p.t.Fatal(err)
	}
	return append([]string{"-pod", podID, "-pod-root", p.dir, "-sds-socket", p.sdsSocket, "-xds-socket", p.xdsSocket,
		"-relay-ready-url", p.relayURL, "-sds-ready-url", p.sdsURL, "-envoy-binary", exe, "-status-addr", "127.0.0.1:0",
		"-envoy-admin", testkit.FreeAddr(p.t), "-envoy-stats-addr", testkit.FreeAddr(p.t),
		"-output-certs", filepath.Join(p.dir, "certs"), "-wait-for", "1m"}, more...)
}

// started is a running launcher.
type started struct {
	l      *launcher.Launcher
	cfg    launcher.Config
	cancel context.CancelFunc
	done   chan error
}

func (p *pod) start(args ...string) *started {
	p.t.Helper()
	cfg, err := launcher.Load(args, testkit.Env(p.env))
	if err != nil {
		p.t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Output: &p.log, Level: hclog.Info})
	l, err := launcher.New(cfg, lifecycle.Deps{Bus: p.nc, Log: log}.WithDefaults())
	if err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{l: l, cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- l.Run(ctx) }()
	p.t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(time.Minute):
			p.t.Error("launcher did not stop")
		}
	})
	return s
}

// wait returns Run's result once it has returned.
func (s *started) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(testkit.Timeout):
		t.Fatal("launcher did not return")
		return nil
	}
}

// event waits for the first event of type T and returns it.
func event[T events.Payload](t *testing.T, p *pod) T {
	t.Helper()
	var got T
	testkit.Eventually(t, "event "+got.EventType(), func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.seen {
			if v, ok := e.(T); ok {
				got = v
				return true
			}
		}
		return false
	})
	return got
}

// has reports whether an event of type T was seen.
func has[T events.Payload](p *pod) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.seen {
		if _, ok := e.(T); ok {
			return true
		}
	}
	return false
}

func run(t *testing.T, f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// identity makes a root and a leaf under it, as PEM.
func identity(t *testing.T) (root, chain, key []byte) {
	t.Helper()
	ca := testkit.NewCA(t, "root", nil, time.Now(), time.Hour)
	chain, key = leafCert(t, ca, 2)
	return pki.EncodeCertPEM(ca.Cert), chain, key
}

// leafCert is a workload leaf (SPIFFE URI, client and server auth) under ca.
func leafCert(t *testing.T, ca *testkit.CA, serial int64) (chain, key []byte) {
	t.Helper()
	lk, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/shop/sa/web")
	lt := &x509.Certificate{SerialNumber: big.NewInt(serial), URIs: []*url.URL{id},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		NotBefore:   time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, lt, ca.Cert, lk.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	key, err = pki.EncodeKeyPEM(lk, true)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key
}
