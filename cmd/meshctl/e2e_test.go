package main

// End-to-end tests: the real service binaries, started by meshctl's own stack code
// against an embedded NATS server, driven through meshctl's commands and through
// real SDS clients on the pods' sockets.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/cli"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var binDir string

func TestMain(m *testing.M) {
	// A storm past -pods-per-worker re-executes meshctl as its workers; in a
	// test, meshctl is this binary.
	if len(os.Args) > 2 && os.Args[1] == "bench" && os.Args[2] == "storm-worker" {
		if err := cli.Run(context.Background(), cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := func() int {
		if d := os.Getenv("MESHAGENT_BIN"); d != "" {
			binDir = d
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "meshbin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, svc := range []string{"signer", "rotator", "operator", "sds-edge", "xds-relay", "launcher", "launcher/cmd/envoy-standin", "node-agent"} {
			cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", filepath.Join(dir, filepath.Base(svc)), "github.com/meshagent/meshagent/services/"+svc)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n%s", svc, err, out)
				return 1
			}
		}
		// The pod's roles in one executable (meshagent pod): without it the
		// one-process pod's tests would skip in make test.
		cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", filepath.Join(dir, "meshagent"), "github.com/meshagent/meshagent/cmd/meshagent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build meshagent: %v\n%s", err, out)
			return 1
		}
		binDir = dir
		return m.Run()
	}()
	os.Exit(code)
}

func startStack(t *testing.T, cfg devstack.Config) *devstack.Runner {
	t.Helper()
	r, _ := startStackLogged(t, cfg)
	return r
}

// startStackLogged is startStack with meshctl's own log (what `make run` logs on
// stderr) kept for the test to read.
func startStackLogged(t *testing.T, cfg devstack.Config) (*devstack.Runner, *testkit.Buffer) {
	t.Helper()
	cfg.BinDir = binDir
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "cluster.local"
	}
	if cfg.RootTTL == 0 {
		cfg.RootTTL = 24 * time.Hour
	}
	if cfg.NATSPort == 0 {
		cfg.NATSPort = -1 // any free port: 4222 may be taken (a compose stack)
	}
	logs := &testkit.Buffer{}
	r, err := devstack.New(cfg, &bytes.Buffer{}, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r, logs
}

func meshctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cli.Run(ctx, cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}, args)
	return out.String() + errb.String(), err
}

func TestUpSignAndServe(t *testing.T) {
	dir := testkit.ShortDir(t)
	var mu sync.Mutex
	var seen []string // event types, in the order the bus delivered them
	r := startStack(t, devstack.Config{Dir: dir, Pods: 1, LeafTTL: time.Hour, OnEvent: func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, m.Header.Get(events.HeaderType))
	}})

	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.NATSURL == "" || st.Signer.GRPCAddr == "" || len(st.Pods) != 1 || st.Pods[0].SPIFFEID != "spiffe://cluster.local/ns/default/sa/demo" {
		t.Fatalf("stack.json incomplete: %+v", st)
	}
	if st.ControlPlane == nil || st.ControlPlane.XDSAddr == "" {
		t.Fatal("stack.json names no control plane")
	}
	// signer, rotator, operator and the pod's sds-edge, xds-relay and launcher.
	if len(st.Processes) != 6 {
		t.Fatalf("want 6 processes in stack.json, got %d", len(st.Processes))
	}
	if out, err := meshctl(t, "status", "-dir", dir); err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}

	t.Run("the launcher runs envoy and serves its status port", func(t *testing.T) {
		pod := st.Pods[0]
		// Envoy started only after the pod's certificate was issued and pushed.
		testkit.Eventually(t, "envoy.ready", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(seen, events.TypeEnvoyReady)
		})
		mu.Lock()
		issued, started := slices.Index(seen, events.TypeCertIssued), slices.Index(seen, events.TypeEnvoyStarted)
		mu.Unlock()
		if issued < 0 || started < issued {
			t.Fatalf("envoy started before the pod's certificate was issued: %v", seen)
		}
		if !strings.HasPrefix(pod.Envoy, "Envoy ") && !strings.HasPrefix(pod.Envoy, "stand-in ") {
			t.Fatalf("stack.json says the launcher runs %q", pod.Envoy)
		}
		// Ready only once Envoy is LIVE: it got its certificates over SDS and its
		// config through the relay.
		if code, body := testkit.HTTPGet("http://" + pod.Status + "/healthz/ready"); code != 200 {
			t.Fatalf("status port /healthz/ready: %d %s", code, body)
		}
		code, body := testkit.HTTPGet("http://" + pod.Status + "/stats/prometheus")
		if code != 200 || !strings.Contains(body, "envoy_") || !strings.Contains(body, "meshagent_sds_edge_") ||
			!strings.Contains(body, "meshagent_launcher_envoy_up 1") {
			t.Fatalf("status port /stats/prometheus: %d\n%s", code, body)
		}
	})

	t.Run("the pod's DNS proxy answers from the demo name table", func(t *testing.T) {
		pod := st.Pods[0]
		if pod.DNS == "" {
			t.Fatal("stack.json names no DNS proxy for the pod")
		}
		// The relay asks for the name table once Envoy connects; poll until it is in.
		var out string
		testkit.Eventually(t, "demo-backend answered from the name table", func() bool {
			var err error
			out, err = meshctl(t, "dns", "-dir", dir, "demo-backend")
			return err == nil && strings.Contains(out, "demo-backend. A 127.0.0.1 (from the mesh's name table")
		})
		if out, err := meshctl(t, "dns", "-dir", dir, "-tcp", "demo-backend.default.svc.cluster.local"); err != nil ||
			!strings.Contains(out, "A 127.0.0.1 (from the mesh's name table") {
			t.Fatalf("over tcp: %v\n%s", err, out)
		}
	})

	t.Run("sign over nats and grpc", func(t *testing.T) {
		for _, extra := range [][]string{nil, {"-grpc"}} {
			out, err := meshctl(t, append([]string{"sign", "-dir", dir, "-ns", "prod", "-sa", "web", "-out", filepath.Join(dir, "out")}, extra...)...)
			if err != nil {
				t.Fatalf("sign %v: %v\n%s", extra, err, out)
			}
			if !strings.Contains(out, "spiffe://cluster.local/ns/prod/sa/web") {
				t.Fatalf("sign %v printed no identity:\n%s", extra, out)
			}
			if fi, err := os.Stat(filepath.Join(dir, "out", "key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("key.pem: %v %v", fi, err)
			}
		}
	})

	t.Run("pod serves a certificate chaining to the trust bundle", func(t *testing.T) {
		pod := st.Pods[0]
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cc, err := sdsclient.DialUnix(ctx, pod.SDSSocket)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		secrets, err := sdsclient.Fetch(ctx, cc, "sidecar~e2e", "default", "ROOTCA")
		if err != nil {
			t.Fatal(err)
		}
		leaf := verifyLeaf(t, secrets["default"], st.TrustBundle)
		if leaf.URIs[0].String() != pod.SPIFFEID {
			t.Fatalf("pod identity %v, want %s", leaf.URIs, pod.SPIFFEID)
		}
		if len(secrets["ROOTCA"].TrustedCA) == 0 {
			t.Fatal("no ROOTCA")
		}
	})

	t.Run("configuration flows through the relay", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cc, err := grpc.NewClient("unix://"+st.Pods[0].XDSSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar~" + st.Pods[0].ID}, TypeUrl: resourcev3.ClusterType})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := ads.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTypeUrl() != resourcev3.ClusterType || len(resp.GetResources()) != 1 || resp.GetVersionInfo() == "" || resp.GetNonce() == "" {
			t.Fatalf("relayed response: %v", resp)
		}
	})

	t.Run("forced renewal reaches the stream", func(t *testing.T) {
		pod := st.Pods[0]
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cc, err := sdsclient.DialUnix(ctx, pod.SDSSocket)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		s, err := sdsclient.Open(ctx, cc, "sidecar~e2e", "default")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		first, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		before := serialOf(t, first.Secrets["default"])
		if out, err := meshctl(t, "rotate", "-dir", dir, "pod", pod.ID); err != nil {
			t.Fatalf("rotate pod: %v\n%s", err, out)
		}
		next, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if after := serialOf(t, next.Secrets["default"]); after == before {
			t.Fatalf("pushed the same certificate %s", after)
		}
	})
	_ = r
}

func serialOf(t *testing.T, s sdsclient.Secret) string {
	t.Helper()
	cs, err := pki.ParseCertsPEM(s.CertChain)
	if err != nil {
		t.Fatal(err)
	}
	return pki.SerialHex(cs[0])
}

func verifyLeaf(t *testing.T, s sdsclient.Secret, bundlePath string) *x509.Certificate {
	t.Helper()
	if !s.IsCertificate() {
		t.Fatal("default is not a certificate with a key")
	}
	bundle, err := os.ReadFile(bundlePath)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundle)
	cs, err := pki.ParseCertsPEM(s.CertChain)
	if err != nil {
		t.Fatal(err)
	}
	inter := x509.NewCertPool()
	for _, c := range cs[1:] {
		inter.AddCert(c)
	}
	if _, err := cs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
		t.Fatalf("leaf does not verify against the trust bundle: %v", err)
	}
	return cs[0]
}

// podTLS follows one pod's `default` and `ROOTCA` over SDS, as Envoy would.
type podTLS struct {
	w *sdsclient.Watcher
}

// handshake runs a mutual TLS handshake between two pods' current certificates,
// each side verifying the other against its own current ROOTCA.
func handshake(a, b *podTLS) error {
	ca, err := a.w.Certificate()
	if err != nil {
		return err
	}
	cb, err := b.w.Certificate()
	if err != nil {
		return err
	}
	ra, err := a.w.Roots()
	if err != nil {
		return err
	}
	rb, err := b.w.Roots()
	if err != nil {
		return err
	}
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	client := tls.Client(c1, &tls.Config{Certificates: []tls.Certificate{*ca}, RootCAs: ra, ServerName: "ignored",
		InsecureSkipVerify: true, VerifyPeerCertificate: verifyWith(ra), MinVersion: tls.VersionTLS13})
	server := tls.Server(c2, &tls.Config{Certificates: []tls.Certificate{*cb}, ClientCAs: rb, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
	errc := make(chan error, 1)
	go func() { errc <- server.Handshake() }()
	cerr := client.Handshake()
	serr := <-errc
	if cerr != nil || serr != nil {
		return fmt.Errorf("client: %v, server: %v", cerr, serr)
	}
	return nil
}

// verifyWith checks the peer chain against roots, as Envoy's SPIFFE validator does
// (SAN URIs, not host names).
func verifyWith(roots *x509.CertPool) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		var certs []*x509.Certificate
		for _, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return err
			}
			certs = append(certs, c)
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
		return err
	}
}

// TestRotationsKeepMutualTLSWorking is issue 4's end-to-end check: three pods with
// short-lived leaves go through several leaf rotations and one root rotation (forced
// by its short TTL, as in production, and not by hand), and a mutual TLS handshake
// between every pair of pods succeeds at every moment.
func TestRotationsKeepMutualTLSWorking(t *testing.T) {
	if testing.Short() {
		t.Skip("several minutes of rotations")
	}
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 3, LeafTTL: 30 * time.Second, RootTTL: 150 * time.Second, RootCheck: 2 * time.Second})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods := make([]*podTLS, len(st.Pods))
	for i, p := range st.Pods {
		cc, err := sdsclient.DialUnix(ctx, p.SDSSocket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		w := sdsclient.NewWatcher(cc, "sidecar~e2e-"+p.ID, hclog.NewNullLogger())
		go func() { _ = w.Run(ctx) }()
		select {
		case <-w.Ready():
		case <-time.After(30 * time.Second):
			t.Fatalf("pod %s: no default and ROOTCA", p.ID)
		}
		pods[i] = &podTLS{w: w}
	}

	// Record every serial and root each pod is seen with, and handshake all pairs
	// continuously until several leaf rotations and a root rotation have happened.
	var (
		mu         sync.Mutex
		serials    = map[int]map[string]bool{}
		rootsSeen  = map[string]bool{}
		handshakes atomic.Int64
		failures   []string
	)
	deadline := time.Now().Add(4 * time.Minute)
	for time.Now().Before(deadline) {
		for i := range pods {
			cert, err := pods[i].w.Certificate()
			if err != nil {
				t.Fatal(err)
			}
			leaf, _ := x509.ParseCertificate(cert.Certificate[0])
			root, _ := x509.ParseCertificate(cert.Certificate[len(cert.Certificate)-1])
			mu.Lock()
			if serials[i] == nil {
				serials[i] = map[string]bool{}
			}
			serials[i][pki.SerialHex(leaf)] = true
			rootsSeen[pki.Fingerprint(root)] = true
			mu.Unlock()
			for j := range pods {
				if i == j {
					continue
				}
				if err := handshake(pods[i], pods[j]); err != nil {
					failures = append(failures, fmt.Sprintf("%s -> %s at %s: %v", st.Pods[i].ID, st.Pods[j].ID, time.Now().Format("15:04:05.000"), err))
				}
				handshakes.Add(1)
			}
		}
		done := len(rootsSeen) >= 2
		for i := range pods {
			done = done && len(serials[i]) >= 4
		}
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := range pods {
		if len(serials[i]) < 4 {
			t.Errorf("pod %s saw %d certificates, want at least 4 (3 rotations)", st.Pods[i].ID, len(serials[i]))
		}
	}
	if len(rootsSeen) < 2 {
		t.Errorf("leaves were seen under %d root(s), want a root rotation", len(rootsSeen))
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d handshakes failed, first: %s", len(failures), handshakes.Load(), failures[0])
	}
	t.Logf("%d handshakes, leaves per pod %d/%d/%d, roots %d", handshakes.Load(), len(serials[0]), len(serials[1]), len(serials[2]), len(rootsSeen))
}

// freeze stops process pid (SIGSTOP: no exit, no closed socket, as a process the
// scheduler starves or a node that hangs) and returns what resumes it (SIGCONT),
// once however often it is called; the test's end resumes it too.
func freeze(t *testing.T, pid int) (resume func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}
