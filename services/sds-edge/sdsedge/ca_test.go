package sdsedge_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestOutputCerts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		keyType string
		alg     pki.KeyAlg
	}{
		{"ec-p256 sec1", nil, "EC PRIVATE KEY", pki.ECP256},
		{"ec-p256 pkcs8", []string{"-pkcs8"}, "PRIVATE KEY", pki.ECP256},
		{"ec-p384", []string{"-key-alg", "EC-P384"}, "EC PRIVATE KEY", pki.ECP384},
		{"rsa-2048 pkcs1", []string{"-key-alg", "RSA-2048"}, "RSA PRIVATE KEY", pki.RSA2048},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			p := v.startPod(podOpt{args: append([]string{"-output-certs", "out"}, tc.args...)})
			dir := filepath.Join(p.cfg.Pod.RootDir, "out")
			st := p.open(t, p.dial(t), "default")
			served := recv(t, st).Secrets["default"]
			check := func(want []byte) {
				t.Helper()
				testkit.Eventually(t, "files written", func() bool {
					b, err := os.ReadFile(filepath.Join(dir, "key.pem"))
					return err == nil && bytes.Equal(b, want)
				})
				key, _ := os.ReadFile(filepath.Join(dir, "key.pem"))
				chain, _ := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
				roots, _ := os.ReadFile(filepath.Join(dir, "root-cert.pem"))
				if b, _ := pem.Decode(key); b == nil || b.Type != tc.keyType {
					t.Fatalf("key.pem block type %v, want %s", b, tc.keyType)
				}
				kp, err := tls.X509KeyPair(chain, key)
				if err != nil {
					t.Fatalf("cert-chain.pem and key.pem do not match: %v", err)
				}
				leaf, _ := x509.ParseCertificate(kp.Certificate[0])
				if alg, _ := pki.AlgOf(leaf.PublicKey); alg != tc.alg {
					t.Fatalf("leaf key %s, want %s", alg, tc.alg)
				}
				pool := x509.NewCertPool()
				if !pool.AppendCertsFromPEM(roots) {
					t.Fatal("root-cert.pem empty")
				}
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
					t.Fatal(err)
				}
				for n, mode := range map[string]os.FileMode{"key.pem": 0o600, "cert-chain.pem": 0o644, "root-cert.pem": 0o644} {
					if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || fi.Mode().Perm() != mode {
						t.Fatalf("%s mode %v, want %v", n, fi.Mode().Perm(), mode)
					}
				}
				// The three names, the link to the current set (..data) and at most
				// two sets (the current one and the one before); no temp files.
				ents, _ := os.ReadDir(dir)
				names, sets := 0, 0
				for _, e := range ents {
					switch n := e.Name(); {
					case strings.HasSuffix(n, ".tmp"):
						t.Fatalf("temp file %s left in output dir", n)
					case strings.HasPrefix(n, "..certs-"):
						sets++
					case n != "..data":
						names++
					}
				}
				if names != 3 || sets == 0 || sets > 2 {
					t.Fatalf("output dir holds %d files and %d sets, want 3 and 1 or 2", names, sets)
				}
			}
			check(served.PrivateKey)
			renew(t, v.nc, "")
			next := recv(t, st).Secrets["default"]
			check(next.PrivateKey) // rewritten on every change
		})
	}
}

// TestNoPrivateKeyOnBus watches every subject through issue, renewal and a trust
// change, and looks for the keys the pod served in every message.
func TestNoPrivateKeyOnBus(t *testing.T) {
	v := newEnv(t)
	all := bustest.Record(t, v.nc, ">")
	p := v.startPod(podOpt{args: []string{"-pkcs8"}})
	st := p.open(t, p.dial(t), "default")
	var keys [][]byte
	keys = append(keys, recv(t, st).Secrets["default"].PrivateKey)
	renew(t, v.nc, "")
	keys = append(keys, recv(t, st).Secrets["default"].PrivateKey)
	renew(t, v.nc, "")
	keys = append(keys, recv(t, st).Secrets["default"].PrivateKey)
	_ = p.stop() // pod.down too
	// The pod's publisher hands pod.down to its own connection on the way out;
	// wait for it to reach the recorder rather than reading too soon.
	_ = p.nc.Flush()
	down, _ := events.PodEventSubject(events.PodRef{Namespace: "default", Name: "web-0"}, events.PodEventDown)
	testkit.Eventually(t, "pod.down recorded", func() bool {
		for _, m := range all.Msgs() {
			if m.Subject == down {
				return true
			}
		}
		return false
	})

	var needles [][]byte
	for _, k := range keys {
		b, _ := pem.Decode(k)
		if b == nil {
			t.Fatal("served key is not PEM")
		}
		needles = append(needles, b.Bytes, []byte(base64.StdEncoding.EncodeToString(b.Bytes)),
			[]byte(base64.RawURLEncoding.EncodeToString(b.Bytes)), bytes.TrimSpace(k))
		// Any 64-column line of the PEM body, in case a message holds a piece of it.
		for _, line := range strings.Split(string(k), "\n")[1:3] {
			needles = append(needles, []byte(line))
		}
	}
	subjects := map[string]int{}
	for _, m := range all.Msgs() {
		subjects[m.Subject]++
		hay := append([]byte(nil), m.Data...)
		for k, vs := range m.Header {
			hay = append(hay, k...)
			for _, s := range vs {
				hay = append(hay, s...)
			}
		}
		if bytes.Contains(hay, []byte("PRIVATE KEY")) {
			t.Fatalf("message on %s mentions PRIVATE KEY", m.Subject)
		}
		for _, n := range needles {
			if bytes.Contains(hay, n) {
				t.Fatalf("message on %s carries private key material", m.Subject)
			}
		}
	}
	want := []string{}
	for _, kind := range []string{events.PodEventSecretPushed, events.PodEventUp, events.PodEventDown} {
		s, _ := events.PodEventSubject(events.PodRef{Namespace: "default", Name: "web-0"}, kind)
		want = append(want, s)
	}
	// The pod connects with its token, so it signs on its identity subject.
	sign, _ := events.IdentitySignSubject(testPodRef, "web")
	for _, s := range append(want, sign) {
		if subjects[s] == 0 {
			t.Errorf("saw no message on %s: the test did not watch the whole cycle (%v)", s, subjects)
		}
	}
}

func TestRetriesWithOneCSRInFlight(t *testing.T) {
	v := newEnv(t)
	v.ca.failNext.Store(3)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "default")
	recv(t, st)
	if got := p.metric(t, "meshagent_sds_edge_csr_failed_total"); got != 3 {
		t.Fatalf("csr failed = %v, want 3", got)
	}
	if got := p.metric(t, "meshagent_sds_edge_csr_retried_total"); got != 3 {
		t.Fatalf("csr retried = %v, want 3", got)
	}
	// A burst of renew events never puts two CSRs in flight.
	for i := 0; i < 20; i++ {
		renew(t, v.nc, "")
	}
	recv(t, st)
	testkit.Eventually(t, "burst handled", func() bool { return v.ca.inFlight.Load() == 0 })
	if m := v.ca.maxFlight.Load(); m != 1 {
		t.Fatalf("%d CSRs in flight at once", m)
	}
}

func TestFreshTokenReadForEveryCSR(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "default")
	recv(t, st)
	first := v.ca.lastReq.Load().Token
	// The kubelet rotates the projected token: the next CSR carries the new one.
	fresh := v.ca.token("default", "web", 2*time.Hour)
	writeToken(t, p.cfg.Pod.RootDir, fresh)
	renew(t, v.nc, "")
	recv(t, st)
	if got := v.ca.lastReq.Load().Token; got != fresh || got == first {
		t.Fatal("the renewal did not use the token now in the file")
	}
	// A token for another service account gets a certificate for that identity
	// (the CA, not the CSR, decides), which the pod refuses and retries: it serves
	// only its own identity.
	writeToken(t, p.cfg.Pod.RootDir, v.ca.token("default", "other", time.Hour))
	failed := p.metric(t, "meshagent_sds_edge_csr_failed_total")
	renew(t, v.nc, "")
	testkit.Eventually(t, "certificate for another identity refused", func() bool { return p.metric(t, "meshagent_sds_edge_csr_failed_total") >= failed+2 })
	writeToken(t, p.cfg.Pod.RootDir, fresh)
	if id := leafOf(t, recv(t, st).Secrets["default"]).URIs[0].String(); id != "spiffe://cluster.local/ns/default/sa/web" {
		t.Fatalf("identity %s", id)
	}
}

func TestRenewalByProofWhenTokenUnreadable(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "default")
	first := leafOf(t, recv(t, st).Secrets["default"])
	if err := os.Remove(p.cfg.CA.TokenFile); err != nil {
		t.Fatal(err)
	}
	renew(t, v.nc, "")
	next := leafOf(t, recv(t, st).Secrets["default"])
	req := v.ca.lastReq.Load()
	if req.Token != "" || len(req.CertChain) == 0 || req.Proof == "" {
		t.Fatalf("renewal request = token %t chain %d proof %t", req.Token != "", len(req.CertChain), req.Proof != "")
	}
	if next.SerialNumber.Cmp(first.SerialNumber) == 0 || next.URIs[0].String() != first.URIs[0].String() {
		t.Fatal("proof renewal did not issue a new certificate for the same identity")
	}
}

func TestIstioGRPCCA(t *testing.T) {
	v := newEnv(t)
	addr := v.ca.serveGRPC(t)
	root := testkit.ShortDir(t)
	rootFile := filepath.Join(root, "ca-root.pem")
	if err := os.WriteFile(rootFile, []byte(v.ca.bundle()[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	before := v.ca.requests.Load()
	p := v.startPod(podOpt{root: root, args: []string{"-ca-addr", addr, "-ca-root-cert", rootFile, "-cluster-id", "east"}})
	st := p.open(t, p.dial(t), "default", "ROOTCA")
	u := recv(t, st)
	for len(u.Secrets) < 2 {
		for n, s := range recv(t, st).Secrets {
			u.Secrets[n] = s
		}
	}
	if id := leafOf(t, u.Secrets["default"]).URIs[0].String(); id != "spiffe://cluster.local/ns/default/sa/web" {
		t.Fatalf("identity %s", id)
	}
	md := *v.ca.lastMD.Load()
	if got := md.Get("clusterid"); len(got) != 1 || got[0] != "east" {
		t.Fatalf("ClusterID metadata %v", got)
	}
	if v.ca.requests.Load()-before != 1 {
		t.Fatalf("%d CSRs, want 1 over gRPC", v.ca.requests.Load()-before)
	}
	if v.ca.lastReq.Load() != nil {
		t.Fatal("the NATS signer was asked with CA_ADDR set")
	}
}

// Over Istio's gRPC API, a pod whose token is gone renews over mTLS with its still-
// valid certificate (istiod's x509 authenticator, the VM flow), and keeps its identity.
func TestIstioGRPCRenewalByCertificate(t *testing.T) {
	v := newEnv(t)
	addr := v.ca.serveGRPC(t)
	root := testkit.ShortDir(t)
	rootFile := filepath.Join(root, "ca-root.pem")
	if err := os.WriteFile(rootFile, []byte(v.ca.bundle()[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	p := v.startPod(podOpt{root: root, args: []string{"-ca-addr", addr, "-ca-root-cert", rootFile}})
	st := p.open(t, p.dial(t), "default")
	first := leafOf(t, recv(t, st).Secrets["default"])
	if v.ca.certAuth.Load() != 0 {
		t.Fatal("first certificate by client certificate: there was none")
	}
	if err := os.Remove(p.cfg.CA.TokenFile); err != nil {
		t.Fatal(err)
	}
	renew(t, v.nc, "")
	next := leafOf(t, recv(t, st).Secrets["default"])
	if v.ca.certAuth.Load() != 1 {
		t.Fatalf("%d requests authenticated by client certificate, want 1", v.ca.certAuth.Load())
	}
	if md := *v.ca.lastMD.Load(); len(md.Get("authorization")) != 0 {
		t.Fatal("renewal by certificate sent an authorization header")
	}
	if next.SerialNumber.Cmp(first.SerialNumber) == 0 || next.URIs[0].String() != first.URIs[0].String() {
		t.Fatal("renewal by certificate did not issue a new certificate for the same identity")
	}
}

// A VM with no token at all gets its identity over mTLS with the provisioned
// certificate (Istio's PROV_CERT: cert-chain.pem and key.pem), then renews with its own.
func TestIstioGRPCProvisionedCertificate(t *testing.T) {
	v := newEnv(t)
	addr := v.ca.serveGRPC(t)
	root := testkit.ShortDir(t)
	if err := os.WriteFile(filepath.Join(root, "ca-root.pem"), []byte(v.ca.bundle()[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	v.ca.mu.Lock()
	ca := &testkit.CA{Cert: v.ca.roots[0], Key: v.ca.keys[0]}
	v.ca.mu.Unlock()
	prov := ca.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/default/sa/web"})
	keyPEM, err := pki.EncodeKeyPEM(prov.Key, false)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "etc", "certs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cert-chain.pem"), pki.EncodeCertPEM(prov.Cert), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	p := v.startPod(podOpt{root: root, noTok: true, args: []string{"-ca-addr", addr, "-ca-root-cert", "ca-root.pem", "-prov-cert", "etc/certs"}})
	st := p.open(t, p.dial(t), "default")
	first := leafOf(t, recv(t, st).Secrets["default"])
	if first.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/web" || first.SerialNumber.Cmp(prov.Cert.SerialNumber) == 0 {
		t.Fatalf("first certificate %v", first.URIs)
	}
	if v.ca.certAuth.Load() != 1 {
		t.Fatalf("%d requests authenticated by client certificate, want 1", v.ca.certAuth.Load())
	}
	renew(t, v.nc, "")
	if next := leafOf(t, recv(t, st).Secrets["default"]); next.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("no renewal")
	}
	if v.ca.certAuth.Load() != 2 {
		t.Fatalf("%d requests authenticated by client certificate, want 2", v.ca.certAuth.Load())
	}
}

func TestIstioGRPCCARejectsUntrustedServer(t *testing.T) {
	v := newEnv(t)
	addr := v.ca.serveGRPC(t)
	root := testkit.ShortDir(t)
	rootFile := filepath.Join(root, "other-root.pem")
	if err := os.WriteFile(rootFile, []byte(newTestCA(t).bundle()[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	p := v.startPod(podOpt{root: root, args: []string{"-ca-addr", addr, "-ca-root-cert", rootFile}})
	testkit.Eventually(t, "tls failures counted", func() bool { return p.metric(t, "meshagent_sds_edge_csr_failed_total") >= 2 })
	if v.ca.requests.Load() != 0 {
		t.Fatal("a CSR reached a CA whose certificate we do not trust")
	}
	if p.e.Ready() == nil {
		t.Fatal("ready without a certificate")
	}
}
