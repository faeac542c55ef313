package signer

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/nats-io/nats.go"
)

// TestExpiredRequestIsNotSigned: a sign request read after its deadline (as a
// signer that was frozen reads its backlog) is dropped unsigned and unanswered: no
// cert.issued is stored, and the drop is counted; the same request with time left
// is signed.
func TestExpiredRequestIsNotSigned(t *testing.T) {
	e := newEnv(t)
	s := e.start(t, e.config("signer-a"))
	pod := events.PodRef{Namespace: "shop", Name: "web-0"}
	subject, err := events.PodSignSubject(pod)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(deadline time.Time) (*nats.Msg, error) {
		_, csr := signertest.CSR(t, pki.ECP256, askedID)
		msg, err := events.NewSignRequestMsg(subject, events.EncodingCompact, "test", events.SignRequest{
			CSR: string(csr), Token: e.token(t, "shop", "web"), Pod: pod, Deadline: deadline})
		if err != nil {
			t.Fatal(err)
		}
		return e.nc.RequestMsg(msg, 2*time.Second)
	}
	before := count(t, e.js, events.SubjectCertIssued)
	for _, late := range []time.Duration{time.Millisecond, time.Minute} {
		if _, err := ask(time.Now().Add(-late)); !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("a request %s past its deadline was answered (err %v): want no reply", late, err)
		}
	}
	if n := count(t, e.js, events.SubjectCertIssued); n != before {
		t.Fatalf("cert.issued count %d -> %d: an expired request was signed", before, n)
	}
	body := s.wantMetrics(t, `meshagent_signer_requests_expired_total{transport="nats"} 2`)
	if strings.Contains(body, `meshagent_signer_certs_issued_total{transport="nats"}`) {
		t.Fatalf("certificates issued for expired requests:\n%s", body)
	}

	reply, err := ask(time.Now().Add(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rep, _, err := events.DecodeSignReply(reply)
	if err != nil || rep.Error != nil || len(rep.CertChain) == 0 {
		t.Fatalf("a request with time left: %+v, %v", rep.Error, err)
	}
	if n := count(t, e.js, events.SubjectCertIssued); n != before+1 {
		t.Fatalf("cert.issued count %d -> %d, want one more", before, n)
	}
}
