package signer

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestPodComesFromTheCredential checks that cert.issued names the pod that the bus
// subject or a pod-bound token proves, and that a request naming a pod its
// credentials do not prove is refused without a trace.
func TestPodComesFromTheCredential(t *testing.T) {
	e := newEnv(t)
	s := e.start(t, e.config("signer-a"))
	b := bundle(t, e.nc)
	rev := rootRevision(t, e.js)
	sa := e.iss.ServiceAccount("shop", "web", e.clock.Now().Add(-time.Second), time.Hour)
	bound := e.iss.Mint(t, sa.ForPod("web-0"))
	unbound := e.iss.Mint(t, sa)
	brokenClaims := sa
	brokenClaims.PodClaim = true
	broken := e.iss.Mint(t, brokenClaims)

	// A certificate to renew with (x509 credentials name no pod).
	key, csr := signertest.CSR(t, pki.ECP256, askedID)
	first := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: bound})
	if first.Error != nil {
		t.Fatal(first.Error)
	}
	if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); ev.Pod != shopPod("web-0") {
		t.Fatalf("first cert recorded for pod %q", ev.Pod)
	}
	leaf := mustCerts(t, first.CertChain)[0]

	// check sends one request over the transport and checks the reply and cert.issued.
	check := func(t *testing.T, sign func() (code, msg string), wantCode, wantMsg, wantPod, wantAuth string) {
		t.Helper()
		before := count(t, e.js, events.SubjectCertIssued)
		code, msg := sign()
		if wantCode != "" {
			if code != wantCode || !strings.Contains(msg, wantMsg) {
				t.Fatalf("got %s %q, want %s %q", code, msg, wantCode, wantMsg)
			}
			if n := count(t, e.js, events.SubjectCertIssued); n != before {
				t.Fatalf("cert.issued %d -> %d after a refused request", before, n)
			}
			return
		}
		if code != "" {
			t.Fatalf("refused: %s %q", code, msg)
		}
		if n := count(t, e.js, events.SubjectCertIssued); n != before+1 {
			t.Fatalf("cert.issued %d -> %d, want one more", before, n)
		}
		if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); ev.Pod != optPod(wantPod) || ev.AuthSource != wantAuth {
			t.Fatalf("cert.issued pod %q auth %s, want %q %s", ev.Pod, ev.AuthSource, wantPod, wantAuth)
		}
	}

	denied, unauth := events.CodePermissionDenied, events.CodeUnauthenticated
	t.Run("nats", func(t *testing.T) {
		for _, tc := range []struct {
			name               string
			busPod             string // the pod sign subject, "" for SubjectSignAny
			token              string
			x509               bool
			pod                string
			wantCode, wantMsg  string
			wantPod, wantAuthn string
		}{
			{"token for another pod", "", bound, false, "db-0", denied, `request names pod "shop/db-0" but its credentials prove pod "shop/web-0"`, "", ""},
			{"token pod used when the request names none", "", bound, false, "", "", "", "web-0", "jwt"},
			{"matching pod", "", bound, false, "web-0", "", "", "web-0", "jwt"},
			{"unproved pod refused", "", unbound, false, "db-0", denied, `request names pod "shop/db-0", which neither its bus subject nor its token proves`, "", ""},
			{"bus subject proves the pod", "db-0", unbound, false, "", "", "", "db-0", "jwt"},
			{"bus subject and token agree", "web-0", bound, false, "web-0", "", "", "web-0", "jwt"},
			{"bus subject and token disagree", "db-0", bound, false, "", denied, `request came on pod "shop/db-0"'s subject but the token was issued for pod "shop/web-0"`, "", ""},
			{"request pod other than the bus subject", "db-0", unbound, false, "web-0", denied, `request names pod "shop/web-0" but its credentials prove pod "shop/db-0"`, "", ""},
			{"no pod anywhere", "", unbound, false, "", "", "", "", "jwt"},
			{"empty pod claim", "", broken, false, "web-0", unauth, "token pod claim", "", ""},
			{"x509 renewal on the pod subject", "web-0", "", true, "", "", "", "web-0", "x509"},
			// The same pod name in another namespace is another pod: never the
			// token's, and never one outside the identity's namespace.
			{"token pod's name in another namespace", "", bound, false, "attacker/web-0", denied, `request names pod "attacker/web-0" but its credentials prove pod "shop/web-0"`, "", ""},
			{"bus subject of another namespace than the identity", "attacker/web-0", unbound, false, "", denied, `pod "attacker/web-0" is not in the namespace of identity`, "", ""},
			{"x509 renewal naming an unproved pod", "", "", true, "web-0", denied, "neither its bus subject nor its token proves", "", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				check(t, func() (string, string) {
					_, csr := signertest.CSR(t, pki.ECP256, askedID)
					req := events.SignRequest{CSR: string(csr), Token: tc.token, Pod: optPod(tc.pod)}
					if tc.x509 {
						req.CertChain, req.Proof = first.CertChain, proof(t, key, csr)
					}
					rep := natsSignAs(t, e.nc, tc.busPod, req)
					if rep.Error != nil {
						if len(rep.CertChain) != 0 {
							t.Fatal("error reply carries a chain")
						}
						return rep.Error.Code, rep.Error.Message
					}
					return "", ""
				}, tc.wantCode, tc.wantMsg, tc.wantPod, tc.wantAuthn)
			})
		}
	})

	// gRPC requests carry no pod: a pod-bound token's pod is recorded.
	client := istioClient(t, s, b.Roots, nil, nil)
	tlsCert := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}
	mtls := istioClient(t, s, b.Roots, &tlsCert, nil)
	grpcCode := map[codes.Code]string{codes.OK: "", codes.PermissionDenied: denied, codes.Unauthenticated: unauth}
	t.Run("grpc", func(t *testing.T) {
		for _, tc := range []struct {
			name               string
			token              string
			wantCode, wantMsg  string
			wantPod, wantAuthn string
		}{
			{"token pod recorded", bound, "", "", "web-0", "jwt"},
			{"no pod claim records no pod", unbound, "", "", "", "jwt"},
			{"empty pod claim", broken, unauth, "token pod claim", "", ""},
			{"mtls renewal records no pod", "", "", "", "", "x509"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				check(t, func() (string, string) {
					_, csr := signertest.CSR(t, pki.ECP256, askedID)
					c := client
					if tc.token == "" {
						c = mtls
					}
					resp, err := istioCreate(c, tc.token, "", csr, 0)
					st, _ := status.FromError(err)
					if err != nil && resp != nil {
						t.Fatal("error with a response")
					}
					code, ok := grpcCode[st.Code()]
					if !ok {
						t.Fatalf("unexpected status %v", err)
					}
					return code, st.Message()
				}, tc.wantCode, tc.wantMsg, tc.wantPod, tc.wantAuthn)
			})
		}
	})

	if got := rootRevision(t, e.js); got != rev {
		t.Fatalf("kv root revision %d -> %d", rev, got)
	}
	s.wantMetrics(t, `meshagent_signer_rejected_total{reason="pod_mismatch",transport="nats"} 7`)
}
