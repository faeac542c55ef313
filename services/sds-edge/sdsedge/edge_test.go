package sdsedge_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestColdStartServesIdentityAndRoots(t *testing.T) {
	v := newEnv(t)
	up := bustest.Record(t, v.nc, events.PodEventWildcard(events.PodEventUp))
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "default", "ROOTCA")
	u := recv(t, st)
	for len(u.Secrets) < 2 { // default and ROOTCA may arrive in separate responses
		for n, s := range recv(t, st).Secrets {
			u.Secrets[n] = s
		}
	}
	def, ca := u.Secrets["default"], u.Secrets["ROOTCA"]
	kp, err := tls.X509KeyPair(def.CertChain, def.PrivateKey)
	if err != nil {
		t.Fatalf("default does not hold a matching chain and key: %v", err)
	}
	leaf := leafOf(t, def)
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/web" {
		t.Fatalf("leaf identity %v", leaf.URIs)
	}
	if alg, _ := pki.AlgOf(kp.PrivateKey.(crypto.Signer).Public()); alg != pki.ECP256 {
		t.Errorf("key algorithm %s, want EC-P256 by default", alg)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.TrustedCA) {
		t.Fatal("ROOTCA holds no roots")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("leaf does not verify against ROOTCA: %v", err)
	}
	fi, err := os.Stat(p.cfg.SDS.Socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if err := p.e.Ready(); err != nil {
		t.Fatalf("not ready after serving: %v", err)
	}
	if req := v.ca.lastReq.Load(); req.Pod != testPodRef || req.Resource != "default" || req.KeyAlgorithm != "EC-P256" || req.TTL != 24*time.Hour || req.Token == "" {
		t.Errorf("sign request = %+v", *req)
	}
	testkit.Eventually(t, "pod.up published", func() bool {
		return len(bustest.Find(up, func(e events.PodUp) bool { return e.Pod == testPodRef && e.Mode == "ca" && e.SPIFFEID != "" })) == 1
	})
	if got := p.metric(t, "meshagent_sds_edge_csr_sent_total"); got < 1 {
		t.Errorf("csr sent = %v", got)
	}
}

func TestRenewDuePushesOnlyToWatchers(t *testing.T) {
	v := newEnv(t)
	pushed := bustest.Record(t, v.nc, events.PodEventWildcard(events.PodEventSecretPushed))
	p := v.startPod(podOpt{})
	cc := p.dial(t)
	def := p.open(t, cc, "default")
	roots := p.open(t, cc, "ROOTCA")
	first := recv(t, def).Secrets["default"]
	rootsVersion := recv(t, roots).Version
	oldSerial := pki.SerialHex(leafOf(t, first))

	renew(t, v.nc, oldSerial)
	next := recv(t, def).Secrets["default"]
	if s := pki.SerialHex(leafOf(t, next)); s == oldSerial {
		t.Fatal("renewal pushed the same certificate")
	}
	if string(next.PrivateKey) == string(first.PrivateKey) {
		t.Fatal("renewal kept the old key")
	}
	testkit.Eventually(t, "pushed event for default with one stream", func() bool {
		return len(bustest.Find(pushed, func(e events.SecretPushed) bool {
			return e.Kind == "pushed" && e.Resource == "default" && e.Streams == 1 && e.Serial == pki.SerialHex(leafOf(t, next))
		})) == 1
	})
	// A stale renew (for a serial already replaced) is ignored.
	before := v.ca.requests.Load()
	renew(t, v.nc, oldSerial)
	if err := v.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	renew(t, v.nc, pki.SerialHex(leafOf(t, next))) // a current one is not
	recv(t, def)
	if got := v.ca.requests.Load() - before; got != 1 {
		t.Fatalf("%d CSRs after one stale and one current renew, want 1", got)
	}
	if n := len(bustest.Find(pushed, func(e events.SecretPushed) bool { return e.Resource == "ROOTCA" && e.Version != rootsVersion })); n != 0 {
		t.Fatalf("ROOTCA pushed %d times without a trust change", n)
	}
}

func TestTrustChangeAndAnchorsPushRootCA(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "ROOTCA")
	if n := strings.Count(string(recv(t, st).Secrets["ROOTCA"].TrustedCA), "BEGIN CERTIFICATE"); n != 1 {
		t.Fatalf("%d roots at start", n)
	}
	v.ca.rotate(t)
	msg, _ := events.NewMsg(events.SubjectTrustChanged, "test-ca", v.ca.trustChanged(t, 2, v.ca.bundle()))
	if err := v.nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	got := recv(t, st).Secrets["ROOTCA"]
	certs, _ := pki.ParseCertsPEM(got.TrustedCA)
	if len(certs) != 2 || !certs[0].Equal(v.ca.roots[0]) || !certs[1].Equal(v.ca.roots[1]) {
		t.Fatalf("ROOTCA after rotation has %d roots, want new and old (newest first)", len(certs))
	}

	anchor := newTestCA(t).roots[0]
	subj, _ := events.PodAnchorsSubject(testPodRef)
	msg, _ = events.NewMsg(subj, "xds-relay", events.TrustAnchors{Pod: testPodRef, Roots: pki.CertPEMs([]*x509.Certificate{anchor})})
	if err := v.nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	got = recv(t, st).Secrets["ROOTCA"]
	certs, _ = pki.ParseCertsPEM(got.TrustedCA)
	if len(certs) != 3 || !certs[2].Equal(anchor) {
		t.Fatalf("ROOTCA with anchors has %d roots", len(certs))
	}
	// A stale trust.changed (older generation) changes nothing: the next push is the anchors' removal.
	msg, _ = events.NewMsg(events.SubjectTrustChanged, "test-ca", v.ca.trustChanged(t, 1, v.ca.bundle()[1:], pki.Fingerprint(v.ca.roots[0])))
	_ = v.nc.PublishMsg(msg)
	msg, _ = events.NewMsg(subj, "xds-relay", events.TrustAnchors{Pod: testPodRef, Roots: []string{}})
	_ = v.nc.PublishMsg(msg)
	certs, _ = pki.ParseCertsPEM(recv(t, st).Secrets["ROOTCA"].TrustedCA)
	if len(certs) != 2 {
		t.Fatalf("after anchors removed and a stale event: %d roots, want 2", len(certs))
	}
}

func TestSafetyDeadlineRenewsWithoutRotator(t *testing.T) {
	v := newEnv(t)
	clk := clock.NewFake(time.Now())
	p := v.startPod(podOpt{clock: clk, args: []string{"-secret-ttl", "1h", "-safety-ratio", "0.8"}})
	st := p.open(t, p.dial(t), "default")
	first := leafOf(t, recv(t, st).Secrets["default"])
	// Two timers: the safety deadline and the expiry watch (a tenth of the life left).
	testkit.Eventually(t, "safety timer armed", func() bool { return clk.Timers() == 2 })
	clk.Add(40 * time.Minute) // before 80% of the hour: the timer stays armed
	if clk.Timers() != 2 || v.ca.requests.Load() != 1 {
		t.Fatalf("renewed before the deadline")
	}
	clk.Add(9 * time.Minute) // past notBefore + 48m
	next := leafOf(t, recv(t, st).Secrets["default"])
	if next.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("safety renewal pushed the same certificate")
	}
	if got := v.ca.requests.Load(); got != 2 {
		t.Fatalf("%d CSRs, want 2", got)
	}
}

func TestNackIsPublishedAndNotResent(t *testing.T) {
	v := newEnv(t)
	nacks := bustest.Record(t, v.nc, events.PodEventWildcard(events.PodEventSDSNack))
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "default")
	resp, err := st.RecvRaw()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Nack(resp, "bad certificate"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "sds.nack published", func() bool {
		return len(bustest.Find(nacks, func(e events.SDSNack) bool {
			return e.Resource == "default" && e.Nonce == resp.Nonce && e.Error == "bad certificate" && e.Version == resp.VersionInfo
		})) == 1
	})
	testkit.Eventually(t, "nack counted", func() bool { return p.metric(t, "meshagent_sds_edge_nacks_total") == 1 })
	// No resend: the next response on the stream is the next certificate.
	renew(t, v.nc, "")
	next, err := st.RecvRaw()
	if err != nil {
		t.Fatal(err)
	}
	if next.VersionInfo == resp.VersionInfo {
		t.Fatal("nacked version was resent")
	}
}

func TestBadRequestsGetErrors(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	cc := p.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		node  string
		names []string
		code  codes.Code
	}{
		{"unknown resource", "n", []string{"default", "nope"}, codes.NotFound},
		{"empty file-cert", "n", []string{"file-cert:"}, codes.NotFound},
		{"missing file-root", "n", []string{"file-root:/no/such/file"}, codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := sdsclient.Open(ctx, cc, tc.node, tc.names...)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			_, err = st.Recv()
			if status.Code(err) != tc.code {
				t.Fatalf("stream: %v, want %v", err, tc.code)
			}
			if _, err := sdsclient.Fetch(ctx, cc, tc.node, tc.names...); status.Code(errors.Unwrap(err)) != tc.code {
				t.Fatalf("fetch: %v, want %v", err, tc.code)
			}
		})
	}
	t.Run("no node id", func(t *testing.T) {
		if _, err := sdsclient.Fetch(ctx, cc, "", "default"); status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
			t.Fatalf("fetch without node: %v", err)
		}
	})
	// The server still serves after all that.
	if _, err := sdsclient.Fetch(ctx, cc, "n", "default"); err != nil {
		t.Fatal(err)
	}
}

func TestGarbageOnSocketLeavesServerServing(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), {0, 1, 2, 3, 4, 5, 0xff, 0xfe}, []byte(strings.Repeat("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 3))} {
		c, err := net.Dial("unix", p.cfg.SDS.Socket)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(junk)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, _ = c.Read(make([]byte, 256))
		c.Close()
	}
	st := p.open(t, p.dial(t), "default")
	if _, ok := recv(t, st).Secrets["default"]; !ok {
		t.Fatal("default not served after garbage")
	}
}

func TestDeltaAndFetch(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	cc := p.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var got map[string]sdsclient.Secret
	testkit.Eventually(t, "fetch answers", func() bool {
		var err error
		got, err = sdsclient.Fetch(ctx, cc, "n", "default", "ROOTCA")
		return err == nil
	})
	if !got["default"].IsCertificate() || !got["ROOTCA"].IsValidationContext() {
		t.Fatalf("fetch = %+v", got)
	}

	ds, err := sdsclient.OpenDelta(ctx, cc, "n", "default")
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	u, err := ds.Recv()
	if err != nil || string(u.Secrets["default"].CertChain) != string(got["default"].CertChain) || u.Versions["default"] == "" {
		t.Fatalf("delta first = %+v, %v", u, err)
	}
	// Subscribing ROOTCA sends only ROOTCA.
	if err := ds.Subscribe([]string{"ROOTCA"}, nil); err != nil {
		t.Fatal(err)
	}
	if u, err = ds.Recv(); err != nil || len(u.Secrets) != 1 || !u.Secrets["ROOTCA"].IsValidationContext() {
		t.Fatalf("delta subscribe = %+v, %v", u, err)
	}
	// A renewal sends only default, with a new version.
	renew(t, v.nc, "")
	if u2, err := ds.Recv(); err != nil || len(u2.Secrets) != 1 || u2.Versions["default"] == u.Versions["default"] {
		t.Fatalf("delta push = %+v, %v", u2, err)
	}
	// After unsubscribing default, a renewal sends nothing; re-subscribing sends it.
	if err := ds.Subscribe(nil, []string{"default"}); err != nil {
		t.Fatal(err)
	}
	// The request is in flight: renew only once the server has applied it.
	testkit.Eventually(t, "default unsubscribed", func() bool { return p.e.Store().Watching("default") == 0 })
	before := p.metric(t, "meshagent_sds_edge_pushes_total")
	serialBefore := p.serial(t, cc)
	renew(t, v.nc, "")
	testkit.Eventually(t, "renewed", func() bool { return p.serial(t, cc) != serialBefore })
	if got := p.metric(t, "meshagent_sds_edge_pushes_total") - before; got != 0 {
		t.Fatalf("pushed to %v streams after unsubscribe", got)
	}
	bad, err := sdsclient.OpenDelta(ctx, cc, "n", "bogus")
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.Recv(); status.Code(err) != codes.NotFound {
		t.Fatalf("delta unknown resource: %v, want NotFound", err)
	}
}

// serial fetches the current default certificate's serial.
func (p *pod) serial(t testing.TB, cc grpc.ClientConnInterface) string {
	t.Helper()
	got, err := sdsclient.Fetch(context.Background(), cc, "n", "default")
	if err != nil {
		t.Fatal(err)
	}
	return pki.SerialHex(leafOf(t, got["default"]))
}

func TestReconnectRefreshesTrustBundle(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "ROOTCA")
	recv(t, st)
	v.ca.rotate(t) // trust.changed missed: nobody publishes it
	if err := p.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	certs, _ := pki.ParseCertsPEM(recv(t, st).Secrets["ROOTCA"].TrustedCA)
	if len(certs) != 2 || !certs[0].Equal(v.ca.roots[0]) {
		t.Fatalf("after reconnect ROOTCA has %d roots, want the new and the old", len(certs))
	}
}

// TestIstioKeyAndSignerEnv: Istio's ECC_SIGNATURE_ALGORITHM / ECC_CURVE choose the
// served key (here through PROXY_CONFIG's proxyMetadata, as a mesh-wide setting
// reaches the agent), and ISTIO_META_CERT_SIGNER is the signer every request asks for.
func TestIstioKeyAndSignerEnv(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{env: map[string]string{
		"PROXY_CONFIG":           `{"proxyMetadata":{"ECC_SIGNATURE_ALGORITHM":"ECDSA","ECC_CURVE":"P384"}}`,
		"ISTIO_META_CERT_SIGNER": "partner",
	}})
	def := recv(t, p.open(t, p.dial(t), "default")).Secrets["default"]
	kp, err := tls.X509KeyPair(def.CertChain, def.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if alg, _ := pki.AlgOf(kp.PrivateKey.(crypto.Signer).Public()); alg != pki.ECP384 {
		t.Fatalf("served key %s, want EC-P384 from ECC_CURVE", alg)
	}
	if req := v.ca.lastReq.Load(); req.CertSigner != "partner" || req.KeyAlgorithm != "EC-P384" {
		t.Fatalf("sign request asks signer %q with %s, want partner, EC-P384", req.CertSigner, req.KeyAlgorithm)
	}
}
