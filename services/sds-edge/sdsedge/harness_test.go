package sdsedge_test

import (
	"context"
	"crypto/x509"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/sdsedge"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
)

const testPod = "web-0"

// testPodRef is the test pod on the bus: the harness runs it in namespace default.
var testPodRef = events.PodRef{Namespace: "default", Name: testPod}

// env is one test's bus and CA.
type env struct {
	t  testing.TB
	ns *server.Server
	nc *nats.Conn
	ca *testCA
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvCA(t, newTestCA(t))
}

// newEnvCA is newEnv with ca as the CA.
func newEnvCA(t testing.TB, ca *testCA) *env {
	t.Helper()
	ns := bustest.Server(t)
	nc := bustest.Conn(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := bus.EnsureEventStream(ctx, bustest.JetStream(t, nc), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	ca.serveNATS(t, nc)
	return &env{t: t, ns: ns, nc: nc, ca: ca}
}

// pod is one running sds-edge.
type pod struct {
	e    *sdsedge.Edge
	cfg  sdsedge.Config
	reg  *prometheus.Registry
	nc   *nats.Conn
	clk  *clock.Fake
	stop func() error
	log  testkit.Buffer // what it logged (warnings and worse)
}

// logs is what the pod has logged so far.
func (p *pod) logs() string { return p.log.String() }

type podOpt struct {
	args  []string
	root  string // pod root; "" makes one
	clock *clock.Fake
	noTok bool
	env   map[string]string // the process environment; nil: empty
}

// startPod writes a token under a fresh pod root and runs sds-edge in process.
func (v *env) startPod(o podOpt) *pod {
	t := v.t
	t.Helper()
	root := o.root
	if root == "" {
		root = testkit.ShortDir(t)
	}
	if !o.noTok {
		writeToken(t, root, v.ca.token("default", "web", time.Hour))
	}
	args := append([]string{"-pod", testPod, "-pod-root", root, "-nats-url", v.ns.ClientURL(), "-namespace", "default",
		"-service-account", "web", "-socket", "sds.sock", "-http-addr", "127.0.0.1:0", "-retry-min", "20ms", "-retry-max", "200ms"}, o.args...)
	cfg, err := sdsedge.Load(args, func(k string) string { return o.env[k] })
	if err != nil {
		t.Fatal(err)
	}
	nc := bustest.Conn(t, v.ns) // its own connection, as a separate process has
	p := &pod{cfg: cfg, reg: prometheus.NewRegistry(), nc: nc}
	deps := lifecycle.Deps{Bus: nc, Log: hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: io.MultiWriter(testWriter{t}, &p.log)}), Metrics: p.reg}
	if o.clock != nil {
		p.clk, deps.Clock = o.clock, o.clock
	}
	e, err := sdsedge.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	p.e = e
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	var runErr error
	p.stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("Run returned %v", err)
		}
	})
	select {
	case <-e.Bound():
	case err := <-done:
		t.Fatalf("sds-edge ended before binding: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("sds-edge did not bind")
	}
	return p
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func writeToken(t testing.TB, root, tok string) {
	t.Helper()
	p := filepath.Join(root, "var/run/secrets/tokens/istio-token")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (p *pod) dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	cc, err := sdsclient.DialUnix(context.Background(), p.cfg.SDS.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func (p *pod) open(t testing.TB, cc grpc.ClientConnInterface, names ...string) *sdsclient.Stream {
	t.Helper()
	st, err := sdsclient.Open(context.Background(), cc, "sidecar~10.0.0.1~"+testPod+".default~default.svc.cluster.local", names...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// recv waits for the next update on st.
func recv(t testing.TB, st *sdsclient.Stream) sdsclient.Update {
	t.Helper()
	return recvWhile(t, st, nil)
}

// recvStepping is recv for an update that a timer on the pod's fake clock brings
// (a retry wait, or what is left of RetryMin after a wake-up): it steps clk by step
// every few milliseconds while it waits, so that the timer fires whether the pod
// armed it before this call or after.
func recvStepping(t testing.TB, st *sdsclient.Stream, clk *clock.Fake, step time.Duration) sdsclient.Update {
	t.Helper()
	return recvWhile(t, st, func() { clk.Add(step) })
}

// recvWhile waits up to 15 s for the next update on st, calling tick (if not nil)
// every 10 ms meanwhile.
func recvWhile(t testing.TB, st *sdsclient.Stream, tick func()) sdsclient.Update {
	t.Helper()
	type res struct {
		u   sdsclient.Update
		err error
	}
	c := make(chan res, 1)
	go func() { u, err := st.Recv(); c <- res{u, err} }()
	timeout := time.After(15 * time.Second)
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case r := <-c:
			if r.err != nil {
				t.Fatalf("recv: %v", r.err)
			}
			return r.u
		case <-ticker.C:
			if tick != nil {
				tick()
			}
		case <-timeout:
			t.Fatal("no sds response in 15s")
			return sdsclient.Update{}
		}
	}
}

func leafOf(t testing.TB, s sdsclient.Secret) *x509.Certificate {
	t.Helper()
	certs, err := pki.ParseCertsPEM(s.CertChain)
	if err != nil || len(certs) == 0 {
		t.Fatalf("secret %q has no certificate: %v", s.Name, err)
	}
	return certs[0]
}

func renew(t testing.TB, nc *nats.Conn, serial string) {
	t.Helper()
	subj, _ := events.PodRenewSubject(testPodRef)
	msg, err := events.NewMsg(subj, "test-rotator", events.RenewDue{Pod: testPodRef, Serial: serial, Reason: events.RenewScheduled})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
}

// metric sums every series of the named metric.
func (p *pod) metric(t testing.TB, name string) float64 {
	t.Helper()
	return obstest.Metric(t, p.reg, name, nil)
}
