package relay_test

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
)

// reach is a Reachability running on its own Dialer, with its log and gauge.
type reach struct {
	r     *upstream.Reachability
	d     *upstream.Dialer
	log   *testkit.Buffer
	gauge func() float64
}

func startReach(t *testing.T, cfg upstream.Config, mat upstream.Material) *reach {
	t.Helper()
	if cfg.Mode == "" {
		cfg.Mode = upstream.Plaintext
	}
	cfg.MaxMsgSize, cfg.ConnectTimeout = 1<<20, 2*time.Second
	buf := &testkit.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: buf, Level: hclog.Info})
	d, err := upstream.New(cfg, mat, log)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r, err := upstream.NewReachability(d, reg, clock.Real{}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close) // after Run has returned: cleanups run last first
	testkit.Background(t, r.Run)
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetName() != upstream.ConnectedMetric {
			t.Fatalf("gather: %v %v", mfs, err)
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	return &reach{r: r, d: d, log: buf, gauge: gauge}
}

// The relay reports its upstream unreachable until a real discovery server
// starts late, reachable once it has, and lost again when it stops; readiness
// stays once reached (a control-plane outage keeps the pod ready, as Istio).
func TestReachabilityFollowsALateUpstream(t *testing.T) {
	addr := testkit.FreeAddr(t)
	x := startReach(t, upstream.Config{Address: addr}, nil)
	testkit.Eventually(t, "not reachable, naming the address and the state", func() bool {
		err := x.r.Ready()
		return err != nil && strings.Contains(err.Error(), addr+" not reachable (TRANSIENT_FAILURE)")
	})
	if x.r.Connected() || x.gauge() != 0 {
		t.Fatal("connected with no server")
	}

	up := newUpstream(t, addr)
	up.start()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			up.stop()
		}
	})
	testkit.Eventually(t, "ready once the server is up", func() bool { return x.r.Ready() == nil && x.r.Connected() })
	if x.gauge() != 1 {
		t.Fatalf("gauge %v, want 1", x.gauge())
	}
	testkit.Eventually(t, "connected logged at INFO", func() bool {
		return strings.Contains(x.log.String(), "[INFO]  upstream connected: address="+addr)
	})

	up.stop()
	stopped = true
	testkit.Eventually(t, "lost when the server stops", func() bool { return !x.r.Connected() && x.gauge() == 0 })
	testkit.Eventually(t, "lost logged at INFO", func() bool {
		return strings.Contains(x.log.String(), "[INFO]  upstream lost: address="+addr)
	})
	if err := x.r.Ready(); err != nil {
		t.Fatalf("readiness after a reached upstream went away: %v, want it kept", err)
	}

	// gRPC's backoff reconnects without any stream asking.
	up.start()
	stopped = false
	testkit.Eventually(t, "connected again", func() bool { return x.r.Connected() && x.gauge() == 1 })
}

// In mTLS the handshake needs sds-edge's workload certificate: with one the
// server does not trust the upstream stays unreachable; once sds-edge serves a
// trusted one, gRPC's next attempt connects. A trust change (the Dialer retires
// its connection) moves the watch to the new connection without reporting a loss.
func TestReachabilityMTLSNeedsSDSCertificate(t *testing.T) {
	ca1 := testkit.NewCA(t, "root 1", nil, time.Now(), time.Hour)
	other := testkit.NewCA(t, "someone else", nil, time.Now(), time.Hour)
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(ca1.Cert)
	srvCert := ca1.Issue(t, testkit.Spec{DNS: []string{"xds.test"}}).TLS()
	up := startUpstream(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs,
	})))

	const nodeID = "xds-relay~" + testPod
	sdsPath, rotate := startSDS(t, nodeID, other.Issue(t, testkit.Spec{ID: workloadID}).TLS(), ca1.Cert)
	x := startReach(t, upstream.Config{Address: up.addr, Mode: upstream.MTLS, ServerName: "xds.test"}, watchSDS(t, sdsPath, nodeID))
	testkit.Eventually(t, "refused without a trusted workload certificate", func() bool {
		err := x.r.Ready()
		return err != nil && strings.Contains(err.Error(), "not reachable (TRANSIENT_FAILURE)")
	})
	rotate(ca1.Issue(t, testkit.Spec{ID: workloadID}).TLS())
	testkit.Eventually(t, "connected with sds-edge's trusted certificate", func() bool {
		return x.r.Ready() == nil && x.r.Connected() && x.gauge() == 1
	})

	if err := x.d.TrustChanged(2, []*x509.Certificate{ca1.Cert}); err != nil {
		t.Fatal(err)
	}
	cc, _, release, err := x.d.Shared()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	// Nothing but the watch connects a new connection (no stream is open).
	testkit.Eventually(t, "the new connection connected by the watch", func() bool { return cc.GetState() == connectivity.Ready })
	if !x.r.Connected() || strings.Contains(x.log.String(), "upstream lost") {
		t.Fatalf("a trust change reported a loss:\n%s", x.log.String())
	}
	if n := strings.Count(x.log.String(), "upstream connected"); n != 1 {
		t.Fatalf("%d connected lines, want 1:\n%s", n, x.log.String())
	}
}
