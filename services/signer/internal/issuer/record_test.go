package issuer

import (
	"context"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/nats-io/nats.go"
)

// recordSubject is where the test's Recorder writes a pod certificate's record.
const recordSubject = "$KV.meshagent-issued.test"

type testRecorder struct{}

func (testRecorder) Msg(leaf *x509.Certificate, _ events.PodRef, _ string, _ time.Time) (*nats.Msg, error) {
	m := nats.NewMsg(recordSubject)
	m.Header.Set(events.HeaderID, pki.SerialHex(leaf))
	return m, nil
}

// orderedPub stores what it is given in order, acking at once, and fails the
// subjects in fail.
type orderedPub struct {
	fail      map[string]bool
	published []string
}

func (p *orderedPub) Publish(msg *nats.Msg, _ time.Time, done func(error)) {
	if p.fail[msg.Subject] {
		done(errors.New("no leader for the stream"))
		return
	}
	p.published = append(p.published, msg.Subject)
	done(nil)
}

// TestTheRecordIsStoredBeforeCertIssued: a pod's certificate is written as its
// record, then cert.issued; when the record cannot be stored the request is
// refused and no cert.issued is written, so the CA's history never names a
// certificate its requester was refused (found by the compose suite pausing the
// stream leader's node: the event stored, the record timed out).
func TestTheRecordIsStoredBeforeCertIssued(t *testing.T) {
	fi := newFuzzIssuer(t)
	fi.iss.cfg.Records = testRecorder{}
	req := fi.podRequest(t)
	issue := func(pub *orderedPub) error {
		t.Helper()
		var got error
		called := 0
		fi.iss.IssueThen(context.Background(), req, Via{Transport: TransportNATS}, pub, func(_ Result, err error) {
			called++
			got = err
		})
		if called != 1 {
			t.Fatalf("done called %d times", called)
		}
		return got
	}

	pub := &orderedPub{}
	if err := issue(pub); err != nil {
		t.Fatal(err)
	}
	if len(pub.published) != 2 || pub.published[0] != recordSubject || pub.published[1] != events.SubjectCertIssued {
		t.Fatalf("stored %v, want the record then cert.issued", pub.published)
	}

	req = fi.podRequest(t) // not a repeat, which the recorded certificate answers
	pub = &orderedPub{fail: map[string]bool{recordSubject: true}}
	err := issue(pub)
	var ie *Error
	if !errors.As(err, &ie) || ie.Code != events.CodeUnavailable {
		t.Fatalf("got %v, want unavailable", err)
	}
	if len(pub.published) != 0 {
		t.Fatalf("stored %v although the record failed: the history would name a refused certificate", pub.published)
	}
}

// podRequest is a sign request for the token's pod with a fresh key and its
// pod-bound token.
func (fi *fuzzIssuer) podRequest(t *testing.T) events.SignRequest {
	t.Helper()
	_, csr := signertest.CSR(t, pki.ECP256, tokenID)
	return events.SignRequest{CSR: string(csr), Token: fi.token, Pod: events.PodRef{Namespace: "shop", Name: tokenPod}}
}
