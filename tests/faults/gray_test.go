package faults

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// TestFrozenSigner freezes (SIGSTOP) one of two signer replicas — the one on the
// pod's NATS node, which keeps its share of the sign queue group's requests until
// that node drops it for missed pings — while the pod
// must renew, then resumes it. The pod renews through the other replica within its
// certificate's life and never serves an expired certificate; the requests the
// frozen replica held (the pod's and the test's own probes, sent with short
// deadlines) are dropped unsigned when it resumes, counted by its
// requests_expired_total; and no certificate was issued that nobody received.
func TestFrozenSigner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster and the service binaries")
	}
	c, nc, ledger := startWatchedCluster(t)
	// signer-2 and the pod on n2, signer-1 on n1: until n2 drops the frozen
	// signer-2, n2 hands it a share of the requests published there (nats-server
	// picks a queue member at random among n2's own members and the other nodes
	// that have one, so about half).
	n1, n2 := "nats://"+c.client["n1"], "nats://"+c.client["n2"]
	f := startFleetAs(t, c, layout{signers: []string{n1, n2}, pod: n2})
	watch := watchReadyFleet(t, f, nc)
	probes, err := nats.Connect(n2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(probes.Close)

	frozen := f.signers[1]
	before := watch.Now().Cur.Serial()
	start := time.Now()
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = frozen.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)

	// Probes from n2 while n2 still counts the frozen replica in: they wait out
	// their deadline there.
	received := map[string]bool{}
	timedOut := 0
	// The queue pick is random, so probe until one has waited on the frozen
	// replica (each probe lands there with odds of about one half).
	for i := 0; i < 16 && timedOut == 0; i++ {
		serial, err := probe(t, probes, f.iss, time.Second)
		if err != nil {
			timedOut++
		} else {
			received[serial] = true
		}
	}
	if timedOut == 0 {
		t.Fatal("no probe reached the frozen replica: the test proves nothing")
	}
	var healed time.Time
	last := time.Time{}
	testkit.EventuallyWithin(t, 40*time.Second, "a new certificate served with signer-2 frozen", func() bool {
		f.alive(t)
		if time.Since(last) > time.Second { // a renew-due, as the rotator would send
			_ = faultcheck.ForceRenew(nc, events.PodRef{Namespace: "default", Name: pod})
			last = time.Now()
		}
		s := watch.Now()
		return s.Up && s.Cur.Serial() != before && !s.Expired()
	})
	if at, ok := watch.FirstServed(watch.Now().Cur.Serial()); ok {
		healed = at
	}
	// Stay frozen past the nodes' ping eviction (pingInterval x (pingMax+1)), renewing
	// every second and probing again: each renewal must get through.
	renewals := 0
	testkit.EventuallyWithin(t, time.Minute, "renewals through the freeze", func() bool {
		f.alive(t)
		if s := watch.Now(); s.Cur.Serial() != before {
			before = s.Cur.Serial()
			renewals++
		}
		if time.Since(last) > time.Second {
			_ = faultcheck.ForceRenew(nc, events.PodRef{Namespace: "default", Name: pod})
			last = time.Now()
			if serial, err := probe(t, probes, f.iss, time.Second); err == nil {
				received[serial] = true
			} else {
				timedOut++
			}
		}
		return time.Since(start) > pingInterval*(pingMax+2)
	})
	if renewals < 3 {
		t.Errorf("%d renewals in %s frozen: the pod did not keep renewing", renewals, time.Since(start))
	}
	frozenFor := time.Since(start)
	resume()

	// The resumed replica reads what it held, and drops it.
	// (A probe that timed out at signer-1, slow under -race, is dropped there.)
	var expired, expiredElsewhere int
	testkit.EventuallyWithin(t, 30*time.Second, "signer-2 back, its held requests dropped", func() bool {
		code, body := testkit.HTTPGet("http://" + f.signerHTTP[1] + "/metrics")
		ready, _ := testkit.HTTPGet("http://" + f.signerHTTP[1] + "/readyz")
		_, other := testkit.HTTPGet("http://" + f.signerHTTP[0] + "/metrics")
		const sample = `meshagent_signer_requests_expired_total{transport="nats"}`
		expired, expiredElsewhere = metricValue(body, sample), metricValue(other, sample)
		return code == 200 && ready == 200 && expired >= 1 && expired+expiredElsewhere >= timedOut
	})
	f.alive(t)
	if err := ledger.Sync(30 * time.Second); err != nil {
		t.Fatalf("read the event stream: %v", err)
	}
	served := watch.ServedSince(start)
	for _, s := range ledger.SeenSince(start) {
		if s.Type == events.TypeCertIssued && !served[s.Key] && !received[s.Key] {
			t.Errorf("certificate %s (by %s) issued that nobody received", s.Key, s.Source)
		}
	}
	if e := faultcheck.MeasureExpiry(watch.Since(start), nil); e.Served > 0 {
		t.Errorf("the pod served an expired certificate for %s", e.Served)
	}
	checkChain(t, nc, watch)
	t.Logf("signer-2 frozen %s: %d probes held by it; the pod's first new certificate served %s after the freeze, %d more renewals; %d held requests dropped unsigned at resume (%d by signer-1)",
		frozenFor.Round(10*time.Millisecond), timedOut, healed.Sub(start).Round(10*time.Millisecond), renewals, expired, expiredElsewhere)
}

// probe asks for a certificate for another pod of the same service account on
// nc, waiting at most within (the request's deadline), and returns its serial.
func probe(t *testing.T, nc *nats.Conn, iss *devtoken.Issuer, within time.Duration) (string, error) {
	t.Helper()
	p := events.PodRef{Namespace: "default", Name: "probe-0"}
	tok, err := iss.MintForPod(p.Namespace, "demo", p.Name, devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, "spiffe://cluster.local/ns/default/sa/demo")
	if err != nil {
		t.Fatal(err)
	}
	subject, err := events.PodSignSubject(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	dl, _ := ctx.Deadline()
	msg, err := events.NewSignRequestMsg(subject, events.EncodingCompact, "faults", events.SignRequest{CSR: string(csr), Token: tok, Pod: p, Deadline: dl})
	if err != nil {
		t.Fatal(err)
	}
	reply, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return "", err
	}
	rep, _, err := events.DecodeSignReply(reply)
	if err == nil && rep.Error != nil {
		err = rep.Error
	}
	if err != nil {
		return "", err
	}
	leaf, err := pki.ParseCertPEMs(rep.CertChain[:1])
	if err != nil || len(leaf) == 0 {
		return "", errors.Join(errors.New("probe reply without a leaf"), err)
	}
	return pki.SerialHex(leaf[0]), nil
}

// metricValue reads one sample's value from a Prometheus text scrape (0 if absent).
func metricValue(body, sample string) int {
	m := regexp.MustCompile(regexp.QuoteMeta(sample) + ` (\d+)`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestSdsEdgeRestartsWarm kills sds-edge (SIGKILL) and starts it again: the new
// process serves the certificate the old one held — the same serial, over SDS —
// without a new signing, and then renews as before. The time from the new process's
// start to the first answer on its socket is logged (the process start, the bus
// connection and the kept pair read back), not asserted.
func TestSdsEdgeRestartsWarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster and the service binaries")
	}
	c := startCluster(t)
	nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	testkit.EventuallyWithin(t, time.Minute, "a JetStream meta leader", func() bool { return c.metaLeader() != "" })
	f := startFleet(t, c)
	var held string
	testkit.EventuallyWithin(t, time.Minute, "the pod's first certificate, kept", func() bool {
		f.alive(t)
		held, _ = fetchDefault(f.socket)
		_, err := os.Stat(filepath.Join(f.podRoot, "var/lib/meshagent/default-key-and-chain.pem"))
		return held != "" && err == nil
	})
	old := f.procs[len(f.procs)-1]
	if old.name != "sds-edge" {
		t.Fatalf("the last process is %s, not sds-edge", old.name)
	}
	if err := old.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-old.done
	began := time.Now()
	f.procs[len(f.procs)-1] = run(t, "sds-edge-again", "sds-edge", f.sdsEnv...)
	var again string
	var took time.Duration
	testkit.EventuallyWithin(t, 30*time.Second, "the restarted sds-edge serving", func() bool {
		f.alive(t)
		again, _ = fetchDefault(f.socket)
		took = time.Since(began)
		return again != ""
	})
	if again != held {
		t.Fatalf("the restarted sds-edge served %s, not the certificate it held (%s)", again, held)
	}
	t.Logf("restarted sds-edge (a new process) served its kept certificate %s after it was started", took.Round(time.Millisecond))
	testkit.EventuallyWithin(t, 30*time.Second, "a renewal after the restart", func() bool {
		f.alive(t)
		_ = faultcheck.ForceRenew(nc, events.PodRef{Namespace: "default", Name: pod})
		s, _ := fetchDefault(f.socket)
		return s != "" && s != held
	})
}

// fetchDefault asks the pod's SDS socket once for `default` and returns its leaf's
// serial ("" with the error when there is none yet).
func fetchDefault(socket string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	cc, err := sdsclient.DialUnix(ctx, socket)
	if err != nil {
		return "", err
	}
	defer cc.Close()
	got, err := sdsclient.Fetch(ctx, cc, "sidecar~10.0.0.1~"+pod+".default~default.svc.cluster.local", "default")
	if err != nil {
		return "", err
	}
	leaf, err := pki.ParseCertsPEM(got["default"].CertChain)
	if err != nil || len(leaf) == 0 {
		return "", errors.Join(errors.New("no leaf in default"), err)
	}
	return pki.SerialHex(leaf[0]), nil
}
