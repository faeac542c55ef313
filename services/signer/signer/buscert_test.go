package signer

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// certEnv is a TLS bus that asks clients for a certificate (and requires none), a
// signer serving its auth callout with a plugged-in CA whose intermediate the test
// holds (to make certificates the signer never issued), and the mesh's root.
type certEnv struct {
	*secureEnv
	inter *testkit.CA
	r     *replica
}

func newCertEnv(t *testing.T, signByID bool) *certEnv {
	t.Helper()
	sec := bustest.SecureTLSServer(t)
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	e := &secureEnv{env: &env{srv: sec.Server, nc: sec.Conn(t, policy.Admin, nil), iss: iss, jwks: iss.WriteJWKS(t, t.TempDir()),
		kek: signertest.KEKFile(t), clock: clock.Real{}}, sec: sec}
	_, inter, dir := pluggedCADir(t, time.Now())
	cfg := e.config("signer-a", signByID)
	cfg.CA.Dir = dir
	return &certEnv{secureEnv: e, inter: inter, r: e.start(t, cfg)}
}

// heldCert is a certificate and its key, as a pod holds them; current is what the
// pod's bus connection presents at its next handshake.
type heldCert struct {
	chain []*x509.Certificate // leaf first, without the root
	key   crypto.Signer
}

func (h heldCert) tls() *tls.Certificate {
	c := &tls.Certificate{PrivateKey: h.key, Leaf: h.chain[0]}
	for _, x := range h.chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

func (h heldCert) pems() []string { return pki.CertPEMs(h.chain) }

// issueTo gets a certificate for pod (namespace shop, account web) the way a pod
// does the first time: connected with its pod-bound token, on its pod subject.
func (e *certEnv) issueTo(t *testing.T, pod string) heldCert {
	t.Helper()
	nc := e.pod(t, "shop", "web", pod, nil)
	defer nc.Close()
	key, csr := signertest.CSR(t, pki.ECP256, "spiffe://cluster.local/ns/shop/sa/web")
	tok := e.iss.Mint(t, e.iss.ServiceAccount("shop", "web", time.Now().Add(-time.Second), time.Hour).ForPod(pod))
	rep := natsSignAs(t, nc, pod, events.SignRequest{CSR: string(csr), Token: tok, Pod: shopPod(pod)})
	if rep.Error != nil {
		t.Fatalf("first certificate of %s: %v", pod, rep.Error)
	}
	certs := mustCerts(t, rep.CertChain)
	return heldCert{chain: certs[:len(certs)-1], key: key}
}

// vmConn connects as a VM does: no token unless given, the pod claimed as user
// name (and its inbox), presenting whatever cert returns at each handshake.
func (e *certEnv) vmConn(t *testing.T, claim, token string, cert func() *tls.Certificate, errs *bustest.Errors) (*nats.Conn, error) {
	t.Helper()
	return e.vmConnInbox(t, claim, claim, token, cert, errs)
}

// vmConnInbox is vmConn with the inbox of pod inbox, whatever it claims.
func (e *certEnv) vmConnInbox(t *testing.T, claim, inbox, token string, cert func() *tls.Certificate, errs *bustest.Errors) (*nats.Conn, error) {
	t.Helper()
	if claim != "" && !strings.Contains(claim, "/") {
		claim = "shop/" + claim // the claim is "<namespace>/<name>"
	}
	opts := append([]nats.Option{nats.Name("vm"), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, shopPod(inbox))), nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond), nats.ErrorHandler(errs.Handler()),
		func(o *nats.Options) error {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if c := cert(); c != nil {
					return c, nil
				}
				return &tls.Certificate{}, nil
			}}
			return nil
		}}, e.sec.TLSOptions()...)
	if claim != "" {
		opts = append(opts, nats.UserInfo(claim, ""))
	}
	if token != "" {
		opts = append(opts, nats.Token(token))
	}
	nc, err := nats.Connect(e.sec.Server.ClientURL(), opts...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// presented is the SHA-256 of the certificate the server holds for the connection
// named name ("" when it is not connected).
func presented(t *testing.T, s *server.Server, name string) string {
	t.Helper()
	cz, err := s.Connz(&server.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.Name == name && len(c.TLSPeerCerts) > 0 {
			return c.TLSPeerCerts[0].CertSha256
		}
	}
	return ""
}

const (
	admittedByCert = `meshagent_signer_bus_callout_admitted_by_certificate_total`
	admittedAll    = `meshagent_signer_bus_callout_admitted_total`
)

// A VM that holds only a certificate (its pod-bound token long gone) gets onto the
// bus as its pod, receives its pod's commands, renews over the bus (on its pod
// subject with a proof, or on its identity subject with -bus-sign-id and no
// credential in the request at all), and its next connection presents the new
// certificate, which admits it again.
func TestVMRenewsOverTheBusWithItsCertificate(t *testing.T) {
	for _, signByID := range []bool{false, true} {
		name := map[bool]string{false: "pod subject with proof", true: "identity subject"}[signByID]
		t.Run(name, func(t *testing.T) {
			e := newCertEnv(t, signByID)
			first := e.issueTo(t, "vm-1")
			var current atomic.Pointer[heldCert]
			current.Store(&first)
			var errs bustest.Errors
			vm, err := e.vmConn(t, "vm-1", "", func() *tls.Certificate { return current.Load().tls() }, &errs)
			if err != nil {
				t.Fatalf("VM with its certificate refused: %v", err)
			}
			if v := metricValue(t, e.r.metrics(t), admittedByCert); v != 1 {
				t.Fatalf("admitted by certificate = %v, want 1", v)
			}
			// Its pod's subjects: a renew command reaches it.
			renewSubj, _ := events.PodRenewSubject(events.PodRef{Namespace: "shop", Name: "vm-1"})
			got, err := vm.SubscribeSync(renewSubj)
			if err != nil {
				t.Fatal(err)
			}
			if err := vm.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := e.nc.Publish(renewSubj, []byte("renew")); err != nil {
				t.Fatal(err)
			}
			if _, err := got.NextMsg(5 * time.Second); err != nil {
				t.Fatalf("VM did not get its pod's renew command: %v", err)
			}

			key, csr := signertest.CSR(t, pki.ECP256, askedID)
			req := events.SignRequest{CSR: string(csr), Pod: events.PodRef{Namespace: "shop", Name: "vm-1"}}
			subject, _ := events.PodSignSubject(events.PodRef{Namespace: "shop", Name: "vm-1"})
			// What a VM's sds-edge sends: its certificate and a proof (on the identity
			// subject the signer takes the identity from the subject and uses neither).
			req.CertChain, req.Proof = first.pems(), proof(t, first.key, csr)
			if signByID {
				subject, _ = events.IdentitySignSubject(shopPod("vm-1"), "web")
			}
			msg, err := events.NewMsgOn(subject, "vm", req)
			if err != nil {
				t.Fatal(err)
			}
			rep := natsRaw(t, vm, msg)
			if rep.Error != nil {
				t.Fatalf("renewal over the bus: %v", rep.Error)
			}
			certs := mustCerts(t, rep.CertChain)
			if id := certs[0].URIs[0].String(); id != "spiffe://cluster.local/ns/shop/sa/web" {
				t.Fatalf("renewed as %s, want the certificate's identity (the CSR asked for %s)", id, askedID)
			}
			if v := metricValue(t, e.r.metrics(t), tokensVerified); v != 1 {
				t.Fatalf("tokens verified = %v, want 1 (the first certificate's only)", v)
			}
			renewed := heldCert{chain: certs[:len(certs)-1], key: key}
			current.Store(&renewed)

			// The next connection presents the new certificate and is admitted by it.
			if got := presented(t, e.srv, "vm"); got != sha(first.chain[0]) {
				t.Fatalf("before the reconnect the VM presented %s, want its first certificate", got)
			}
			if err := vm.ForceReconnect(); err != nil {
				t.Fatal(err)
			}
			testkit.EventuallyWithin(t, 10*time.Second, "VM reconnected with its new certificate", func() bool {
				return vm.IsConnected() && presented(t, e.srv, "vm") == sha(renewed.chain[0])
			})
			if v := metricValue(t, e.r.metrics(t), admittedByCert); v != 2 {
				t.Fatalf("admitted by certificate = %v, want 2", v)
			}
			if err := e.nc.Publish(renewSubj, []byte("renew")); err != nil {
				t.Fatal(err)
			}
			if _, err := got.NextMsg(5 * time.Second); err != nil {
				t.Fatalf("VM did not get its renew command after the reconnect: %v", err)
			}
			if len(errs.All()) > 0 {
				t.Fatalf("VM saw errors: %v", errs.All())
			}
		})
	}
}

// Certificates the callout must not admit as a pod, each refused naming why, and
// none admitted: expired, not yet valid, from a foreign root, for a foreign trust
// domain, valid but never issued to a pod by the signers, a forged copy of an issued
// one (same serial and identity, another certificate), another pod's for this
// pod's claim; and none at all.
func TestBusRefusesCertificatesItShouldNot(t *testing.T) {
	e := newCertEnv(t, true)
	now := time.Now()
	web := "spiffe://cluster.local/ns/shop/sa/web"
	issued := e.issueTo(t, "vm-2")
	leaf := func(ca *testkit.CA, s testkit.Spec) heldCert {
		l := ca.Issue(t, s)
		chain := []*x509.Certificate{l.Cert}
		if ca == e.inter {
			chain = append(chain, e.inter.Cert)
		}
		return heldCert{chain: chain, key: l.Key}
	}
	foreign := testkit.NewCA(t, "foreign", nil, now, time.Hour)
	cases := []struct {
		name, claim, reason string
		cert                *heldCert
	}{
		{"expired", "vm-1", "cert_expired", ptr(leaf(e.inter, testkit.Spec{ID: web, NotBefore: now.Add(-3 * time.Hour), Life: time.Hour}))},
		{"not yet valid", "vm-1", "cert_not_yet_valid", ptr(leaf(e.inter, testkit.Spec{ID: web, NotBefore: now.Add(time.Hour), Life: time.Hour}))},
		{"foreign root", "vm-1", "cert_foreign_root", ptr(leaf(foreign, testkit.Spec{ID: web}))},
		{"foreign trust domain", "vm-1", "cert_foreign_domain", ptr(leaf(e.inter, testkit.Spec{ID: "spiffe://other.example/ns/shop/sa/web"}))},
		{"no record (the CA's key, not the signers')", "vm-1", "cert_not_recorded", ptr(leaf(e.inter, testkit.Spec{ID: web}))},
		{"forged copy of an issued certificate", "vm-2", "cert_not_recorded", ptr(leaf(e.inter, testkit.Spec{ID: web, Serial: issued.chain[0].SerialNumber}))},
		{"another pod's certificate", "vm-1", "pod_mismatch", &issued},
		{"no certificate, no token", "vm-1", "no_token", nil},
	}
	admittedBefore := metricValue(t, e.r.metrics(t), admittedAll)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			series := `meshagent_signer_bus_callout_refused_total{reason="` + tc.reason + `"}`
			before := metricValue(t, e.r.metrics(t), series)
			cert := func() *tls.Certificate {
				if tc.cert == nil {
					return nil
				}
				return tc.cert.tls()
			}
			if nc, err := e.vmConn(t, tc.claim, "", cert, nil); err == nil {
				nc.Close()
				t.Fatal("admitted")
			}
			testkit.EventuallyWithin(t, 30*time.Second, series, func() bool { return metricValue(t, e.r.metrics(t), series) == before+1 })
		})
	}
	if got := metricValue(t, e.r.metrics(t), admittedAll); got != admittedBefore {
		t.Fatalf("the callout admitted %v connections", got-admittedBefore)
	}

	// Without a claim, another pod's certificate is that pod: it gets nothing of vm-1's.
	var errs bustest.Errors
	nc, err := e.vmConnInbox(t, "", "vm-2", "", func() *tls.Certificate { return issued.tls() }, &errs)
	if err != nil {
		t.Fatalf("vm-2's certificate without a claim: %v", err)
	}
	received := metricValue(t, e.r.metrics(t), csrsReceived)
	own, _ := events.IdentitySignSubject(shopPod("vm-1"), "web")
	_, csr := signertest.CSR(t, pki.ECP256, web)
	msg, err := events.NewMsgOn(own, "vm", events.SignRequest{CSR: string(csr), CertChain: issued.pems(), Proof: proof(t, issued.key, csr)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.RequestMsg(msg, 300*time.Millisecond); err == nil {
		t.Fatal("a request on vm-1's identity subject was answered")
	}
	renewSubj, _ := events.PodRenewSubject(events.PodRef{Namespace: "shop", Name: "vm-1"})
	if _, err := nc.Subscribe(renewSubj, func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "permission violations", func() bool {
		var pub, sub bool
		for _, err := range errs.All() {
			pub = pub || strings.Contains(err.Error(), `Permissions Violation for Publish to "`+own+`"`)
			sub = sub || strings.Contains(err.Error(), `Permissions Violation for Subscription to "`+renewSubj+`"`)
		}
		return pub && sub
	})
	if after := metricValue(t, e.r.metrics(t), csrsReceived); after != received {
		t.Fatalf("csrs received %v -> %v", received, after)
	}
}

// The roles that use no certificate are unchanged on a bus that asks for one: a
// pod with its token (and a token refused, with a certificate beside it, falls back
// to the certificate), and the nkey roles.
func TestTokenPodsAndServicesNeedNoCertificate(t *testing.T) {
	e := newCertEnv(t, false)
	pod := e.pod(t, "shop", "web", "web-0", nil)
	if rep := bundle(t, pod); len(rep.Roots) == 0 {
		t.Fatal("no roots")
	}
	if rep := bundle(t, e.nc); len(rep.Roots) == 0 { // admin, an nkey over TLS without a certificate
		t.Fatal("no roots")
	}
	held := e.issueTo(t, "vm-1")
	expired := e.iss.Mint(t, e.iss.ServiceAccount("shop", "web", time.Now().Add(-3*time.Hour), time.Hour).ForPod("vm-1"))
	if _, err := e.vmConn(t, "vm-1", expired, func() *tls.Certificate { return held.tls() }, nil); err != nil {
		t.Fatalf("expired token with a valid certificate: %v", err)
	}
	if v := metricValue(t, e.r.metrics(t), admittedByCert); v != 1 {
		t.Fatalf("admitted by certificate = %v, want 1", v)
	}
	// A token for another pod than the one claimed is refused too.
	const mismatch = `meshagent_signer_bus_callout_refused_total{reason="pod_mismatch"}`
	before := metricValue(t, e.r.metrics(t), mismatch)
	other := e.iss.Mint(t, e.iss.ServiceAccount("shop", "web", time.Now().Add(-time.Second), time.Hour).ForPod("web-9"))
	if _, err := e.vmConn(t, "web-0", other, func() *tls.Certificate { return nil }, nil); err == nil {
		t.Fatal("token for web-9 admitted as web-0")
	}
	testkit.EventuallyWithin(t, 30*time.Second, "pod_mismatch counted", func() bool { return metricValue(t, e.r.metrics(t), mismatch) == before+1 })
}

func ptr[T any](v T) *T { return &v }

func sha(c *x509.Certificate) string { return pki.Fingerprint(c) }
