package signer

import (
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A pod that keeps asking for certificates (it refuses each one it gets: its trust
// does not accept the chain) is told why once it had -max-early-certs-per-minute
// early ones (each before the one before was a quarter through its life) in a
// minute, and nothing more is issued or recorded for it; others are served.
func TestPodThatKeepsAskingIsToldWhy(t *testing.T) {
	e := newEnv(t)
	c := e.config("signer-r")
	c.Certs.MaxEarlyPerMinute = 3
	s := e.start(t, c)
	tok := e.token(t, "shop", "web")
	sign := func(tok string) events.SignReply {
		_, csr := signertest.CSR(t, pki.ECP256, askedID)
		return natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: tok})
	}
	for i := range 4 { // the first, then 3 early ones
		if rep := sign(tok); rep.Error != nil {
			t.Fatalf("certificate %d: %v", i+1, rep.Error)
		}
	}
	testkit.Eventually(t, "4 cert.issued", func() bool { return count(t, e.js, events.SubjectCertIssued) == 4 })
	rep := sign(tok)
	if rep.Error == nil || rep.Error.Code != events.CodeResourceExhausted || !strings.Contains(rep.Error.Message, "was issued 3 certificates") ||
		!strings.Contains(rep.Error.Message, "ROOTCA") || len(rep.CertChain) != 0 {
		t.Fatalf("the 5th request in a minute: %+v", rep.Error)
	}
	if rep := sign(e.token(t, "shop", "db")); rep.Error != nil {
		t.Fatalf("another identity: %v", rep.Error)
	}
	testkit.Eventually(t, "5 cert.issued", func() bool { return count(t, e.js, events.SubjectCertIssued) == 5 })
	if n := count(t, e.js, events.SubjectCertIssued); n != 5 {
		t.Fatalf("%d cert.issued: one was recorded for the refused request", n)
	}
	s.wantMetrics(t, `meshagent_signer_rejected_total{reason="reissue_limit",transport="nats"} 1`)
}
