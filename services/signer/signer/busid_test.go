package signer

import (
	"encoding/pem"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// secureEnv is a bus secured with the real role table, and signers that serve its
// real auth callout.
type secureEnv struct {
	*env
	sec *bustest.Secured
}

func newSecureEnv(t *testing.T) *secureEnv {
	sec := bustest.SecureServer(t)
	iss := tokentest.NewIssuer(t, "meshagent-dev")
	e := &env{srv: sec.Server, nc: sec.Conn(t, policy.Admin, nil), iss: iss, jwks: iss.WriteJWKS(t, t.TempDir()), kek: signertest.KEKFile(t), clock: clock.Real{}}
	return &secureEnv{env: e, sec: sec}
}

// config is a replica that connects as the signer role and serves the callout;
// signByID is -bus-sign-id.
func (e *secureEnv) config(instance string, signByID bool) config.Config {
	c := e.env.config(instance)
	c.Bus.URL = e.sec.Server.ClientURL()
	c.Bus.NKeyFile = e.sec.Creds.SeedFile(policy.Signer)
	c.Bus.TLS.CAFile = e.sec.CAFile // "" on a plaintext bus
	c.Bus.AsService(policy.Signer)
	c.BusCallout.IssuerSeed = e.sec.Creds.IssuerFile()
	c.BusCallout.NKeyFile = e.sec.Creds.SeedFile(policy.Callout)
	c.BusCallout.SignByIdentity = signByID
	return c
}

func (e *secureEnv) start(t *testing.T, cfg config.Config) *replica {
	t.Helper()
	log := hclog.NewNullLogger()
	http := obs.NewServer(cfg.Listen.HTTP, log)
	s, err := New(cfg, lifecycle.Deps{Bus: e.sec.Conn(t, policy.Signer, nil), Clock: e.clock, Log: log, Metrics: http.Registry(), Health: http})
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{Signer: s, http: http}
	done := r.run(t)
	testkit.EventuallyWithin(t, 20*time.Second, "signer ready", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("signer exited: %v", err)
		default:
		}
		return r.ready() == nil && r.http.Addr() != nil
	})
	return r
}

// pod connects as a pod with a token bound to it, admitted by the signers' callout.
func (e *secureEnv) pod(t *testing.T, ns, sa, pod string, errs *bustest.Errors) *nats.Conn {
	t.Helper()
	tok := e.iss.Mint(t, e.iss.ServiceAccount(ns, sa, time.Now().Add(-time.Second), time.Hour).ForPod(pod))
	nc, err := e.sec.PodConn(t, events.PodRef{Namespace: ns, Name: pod}, tok, errs)
	if err != nil {
		t.Fatalf("pod %s/%s/%s admitted: %v", ns, sa, pod, err)
	}
	return nc
}

// metricValue reads one sample of the Prometheus text body (0 when absent).
func metricValue(t *testing.T, body, sample string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

const (
	tokensVerified = `meshagent_signer_tokens_verified_total{transport="nats"}`
	csrsReceived   = `meshagent_signer_csr_received_total{transport="nats"}`
	certsIssued    = `meshagent_signer_certs_issued_total{transport="nats"}`
)

// TestSignOnIdentitySubjectWithoutTokenVerification: a pod admitted by the callout
// signs on its identity subject; the signer takes the identity from the subject
// (the token in the body is not verified again, nor used: it is garbage here) and
// still checks the CSR; the pod cannot publish on another identity's subject.
func TestSignOnIdentitySubjectWithoutTokenVerification(t *testing.T) {
	e := newSecureEnv(t)
	cfg := e.config("signer-a", true)
	r := e.start(t, cfg)
	var errs bustest.Errors
	pod := e.pod(t, "shop", "web", "web-0", &errs)
	own, _ := events.IdentitySignSubject(shopPod("web-0"), "web")

	sign := func(subject string, req events.SignRequest) events.SignReply {
		t.Helper()
		msg, err := events.NewMsgOn(subject, "test", req)
		if err != nil {
			t.Fatal(err)
		}
		return natsRaw(t, pod, msg)
	}
	var csr []byte
	for range 3 { // each with a new key: a repeated CSR is answered with its certificate
		_, csr = signertest.CSR(t, pki.ECP256, askedID)
		rep := sign(own, events.SignRequest{CSR: string(csr), Token: "not-even-a-jwt", Pod: events.PodRef{Namespace: "shop", Name: "web-0"}})
		if rep.Error != nil {
			t.Fatalf("sign on %s: %v", own, rep.Error)
		}
		if got := mustCerts(t, rep.CertChain)[0].URIs[0].String(); got != "spiffe://cluster.local/ns/shop/sa/web" {
			t.Fatalf("issued for %s, want the subject's identity", got)
		}
	}
	m := r.metrics(t)
	if v := metricValue(t, m, tokensVerified); v != 0 {
		t.Fatalf("tokens verified per request = %v, want 0 (the callout verified it at connect)", v)
	}
	if v := metricValue(t, m, certsIssued); v != 3 {
		t.Fatalf("certs issued = %v, want 3", v)
	}
	// Still checked: the CSR, the TTL bound, the pod named in the request.
	for _, tc := range []struct {
		req  events.SignRequest
		code string
	}{
		{events.SignRequest{CSR: tampered(t, csr), Token: "x", Pod: events.PodRef{Namespace: "shop", Name: "web-0"}}, events.CodeInvalidArgument},
		{events.SignRequest{CSR: string(csr), Token: "x", TTL: cfg.Certs.MaxTTL + time.Hour}, events.CodeInvalidArgument},
		{events.SignRequest{CSR: string(csr), Token: "x", Pod: events.PodRef{Namespace: "shop", Name: "db-0"}}, events.CodePermissionDenied},
	} {
		if rep := sign(own, tc.req); rep.Error == nil || rep.Error.Code != tc.code {
			t.Fatalf("pod %q ttl %s: got %v, want %s", tc.req.Pod, tc.req.TTL, rep.Error, tc.code)
		}
	}

	// The same pod on its pod subject: its token is verified per request, as before.
	podSubject, _ := events.PodSignSubject(events.PodRef{Namespace: "shop", Name: "web-0"})
	tok := e.iss.Mint(t, e.iss.ServiceAccount("shop", "web", time.Now().Add(-time.Second), time.Hour).ForPod("web-0"))
	if rep := sign(podSubject, events.SignRequest{CSR: string(csr), Token: tok}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if v := metricValue(t, r.metrics(t), tokensVerified); v != 1 {
		t.Fatalf("tokens verified per request = %v after a sign.pod request, want 1", v)
	}

	// Another identity's subject: the server refuses the publish, the signer sees
	// nothing and issues nothing.
	before := metricValue(t, r.metrics(t), csrsReceived)
	for _, other := range [][3]string{{"shop", "admin", "web-0"}, {"bank", "vault", "vault-0"}} {
		subj, _ := events.IdentitySignSubject(events.PodRef{Namespace: other[0], Name: other[2]}, other[1])
		msg, err := events.NewMsgOn(subj, "test", events.SignRequest{CSR: string(csr), Token: "x"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pod.RequestMsg(msg, 300*time.Millisecond); err == nil {
			t.Fatalf("request on %s answered", subj)
		}
		testkit.Eventually(t, "permission violation on "+subj, func() bool {
			for _, err := range errs.All() {
				if strings.Contains(err.Error(), `Permissions Violation for Publish to "`+subj+`"`) {
					return true
				}
			}
			return false
		})
	}
	if after := metricValue(t, r.metrics(t), csrsReceived); after != before {
		t.Fatalf("csrs received %v -> %v after requests on other identities", before, after)
	}
}

// TestIdentitySubjectWithoutOptInVerifiesTheToken: without -bus-sign-id the signer
// still answers identity subjects — one round trip for every pod, whatever its
// signers run with — but believes only the token in the request, as on the pod
// subject: a garbage token is refused and signs nothing, the pod's own is signed.
func TestIdentitySubjectWithoutOptInVerifiesTheToken(t *testing.T) {
	e := newSecureEnv(t)
	r := e.start(t, e.config("signer-a", false))
	pod := e.pod(t, "shop", "web", "web-0", nil)
	own, _ := events.IdentitySignSubject(shopPod("web-0"), "web")
	ask := func(token string) events.SignReply {
		t.Helper()
		_, csr := signertest.CSR(t, pki.ECP256, askedID)
		msg, err := events.NewSignRequestMsg(own, events.EncodingCompact, "test", events.SignRequest{CSR: string(csr), Token: token, Pod: shopPod("web-0")})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := pod.RequestMsg(msg, 5*time.Second)
		if err != nil {
			t.Fatalf("request on %s: %v", own, err)
		}
		rep, _, err := events.DecodeSignReply(resp)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := ask("x"); rep.Error == nil || rep.Error.Code != events.CodeUnauthenticated {
		t.Fatalf("garbage token on the identity subject without -bus-sign-id: %+v, want unauthenticated", rep.Error)
	}
	if v := metricValue(t, r.metrics(t), certsIssued); v != 0 {
		t.Fatalf("certs issued = %v after a refused request", v)
	}
	tok := e.iss.Mint(t, e.iss.ServiceAccount("shop", "web", time.Now().Add(-time.Second), time.Hour).ForPod("web-0"))
	if rep := ask(tok); rep.Error != nil || len(rep.CertChain) == 0 {
		t.Fatalf("the pod's own token: %+v", rep.Error)
	}
	if v := metricValue(t, r.metrics(t), tokensVerified); v < 1 {
		t.Fatalf("tokens verified = %v: the token was not checked", v)
	}
}

// tampered is csrPEM with its signature's last byte flipped: well-formed, not signed
// by its key.
func tampered(t *testing.T, csrPEM []byte) string {
	t.Helper()
	b, _ := pem.Decode(csrPEM)
	if b == nil {
		t.Fatal("csr is not PEM")
	}
	der := append([]byte(nil), b.Bytes...)
	der[len(der)-1] ^= 0xff
	return string(pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: der}))
}
