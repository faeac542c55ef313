package issuer

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// issueVia asks fi's issuer for req as IssueThen's callers do and returns what done
// got; done must be called exactly once.
func (fi *fuzzIssuer) issueVia(t *testing.T, req events.SignRequest, via Via, pub AsyncPublisher) (Result, error) {
	t.Helper()
	var res Result
	var err error
	called := 0
	fi.iss.IssueThen(context.Background(), req, via, pub, func(r Result, e error) { res, err = r, e; called++ })
	if called != 1 {
		t.Fatalf("done called %d times", called)
	}
	return res, err
}

// TestARepeatedRequestGetsTheCertificateRecordedForIt: a pod whose answer was lost
// (it timed out as the certificate was signed) asks again with the same CSR and is
// given the certificate already recorded for it — nothing is signed or written
// again, so a storm that outlasts its requesters' timeouts wastes no certificate.
// Everything the certificate depends on makes a new request: another CSR, another
// lifetime, another identity presenting the same CSR (a pod of the same name in
// another namespace too), a certificate whose record failed, the end of
// AnswerWindow, and new CA material in between.
func TestARepeatedRequestGetsTheCertificateRecordedForIt(t *testing.T) {
	fi := newFuzzIssuer(t)
	fi.iss.cfg.Records = testRecorder{}
	clk := clock.NewFake(fuzzNow)
	fi.iss.clk = clk
	pub := &orderedPub{}
	pod := Via{Transport: TransportNATS}
	req := fi.podRequest(t)
	first, err := fi.issueVia(t, req, pod, pub)
	if err != nil {
		t.Fatal(err)
	}
	serial := pki.SerialHex(first.Leaf)
	issued := func() float64 { return testutil.ToFloat64(fi.iss.metrics.Issued.WithLabelValues(TransportNATS)) }
	repeats := func() float64 { return testutil.ToFloat64(fi.iss.metrics.Repeats.WithLabelValues(TransportNATS)) }

	clk.Add(10 * time.Second) // the requester's timeout, then its retry
	again, err := fi.issueVia(t, req, pod, pub)
	if err != nil {
		t.Fatal(err)
	}
	if got := pki.SerialHex(again.Leaf); got != serial {
		t.Fatalf("the repeat got certificate %s, want the recorded %s", got, serial)
	}
	if len(again.Chain) != len(first.Chain) || again.Chain[0] != first.Chain[0] || again.Generation != first.Generation {
		t.Fatal("the repeat's chain or generation differ from the first answer's")
	}
	if len(pub.published) != 2 || issued() != 1 || repeats() != 1 {
		t.Fatalf("after a repeat: %d writes, %v issued, %v repeats; want the first certificate's 2 writes, 1 issued, 1 repeat", len(pub.published), issued(), repeats())
	}

	fresh := func(what string, req events.SignRequest, via Via) Result {
		t.Helper()
		writes := len(pub.published)
		res, err := fi.issueVia(t, req, via, pub)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if pki.SerialHex(res.Leaf) == serial {
			t.Fatalf("%s: answered with the earlier certificate %s", what, serial)
		}
		if len(pub.published) == writes {
			t.Fatalf("%s: the new certificate was not recorded", what)
		}
		return res
	}
	fresh("another CSR", fi.podRequest(t), pod)
	longer := req
	longer.TTL = 2 * time.Hour
	fresh("the same CSR for another lifetime", longer, pod)

	// An attacker holding another credential replays the pod's CSR (it is public):
	// it gets a certificate for its own identity, never the pod's.
	replay := events.SignRequest{CSR: req.CSR}
	stolen := fresh("the pod's CSR with another credential", replay, Via{Transport: TransportNATS, PeerChain: fi.clientPeer})
	if len(stolen.Leaf.URIs) != 1 || stolen.Leaf.URIs[0].String() != certID {
		t.Fatalf("the replayed CSR was issued %v, want the replayer's own %s", stolen.Leaf.URIs, certID)
	}

	// A pod of the same name in another namespace, with its own token, sends the
	// same CSR: it is another holder and another identity.
	otherTok := fi.jwtIss.Mint(t, fi.jwtIss.ServiceAccount("other", "web", fuzzNow.Add(-time.Minute), time.Hour).ForPod(tokenPod))
	namesake := req
	namesake.Token, namesake.Pod = otherTok, events.PodRef{Namespace: "other", Name: tokenPod}
	if got := fresh("the same CSR from a pod of the same name in another namespace", namesake, pod); got.Leaf.URIs[0].String() != "spiffe://cluster.local/ns/other/sa/web" {
		t.Fatalf("the namesake was issued %v", got.Leaf.URIs)
	}

	// A certificate whose record was not stored was refused; it answers nothing.
	lost := fi.podRequest(t)
	if _, err := fi.issueVia(t, lost, pod, &orderedPub{fail: map[string]bool{recordSubject: true}}); err == nil {
		t.Fatal("issued although its record failed")
	}
	fresh("a repeat of a request whose record failed", lost, pod)

	clk.Add(AnswerWindow)
	fresh("the same request after the answer window", req, pod)

	// New CA material in between (here a new intermediate; a root rotation installs
	// new material the same way): the repeat is signed under it.
	req = fi.podRequest(t)
	before := fi.iss.auth.Current()
	under := fresh("a new request", req, pod)
	inter2 := testkit.NewCA(t, "inter2", fi.rootCA, fuzzNow, 30*24*time.Hour)
	signertest.WriteCACerts(t, fi.dir, inter2, []*x509.Certificate{fi.root}, fi.root)
	if !fi.plugged.Reload(context.Background()) || fi.iss.auth.Current() == before {
		t.Fatal("the CA's new files were not loaded")
	}
	serial = pki.SerialHex(under.Leaf)
	rotated := fresh("the same request under new CA material", req, pod)
	if err := rotated.Leaf.CheckSignatureFrom(inter2.Cert); err != nil {
		t.Fatalf("the repeat under new material is not signed by the new intermediate: %v", err)
	}
}

// TestAnswersForgetTheOldestPastTheBound: the answers kept are bounded; past
// maxAnswers the oldest is forgotten first, and one past AnswerWindow is gone.
func TestAnswersForgetTheOldestPastTheBound(t *testing.T) {
	fi := newFuzzIssuer(t)
	mat := fi.iss.auth.Current()
	leaf := fi.clientPeer[0]
	var a answers
	key := func(i int) answerKey { return newAnswerKey("ns/pod", tokenID, "", time.Duration(i), nil) }
	for i := range maxAnswers + 10 {
		a.put(key(i), leaf, mat, fuzzNow)
	}
	if len(a.by) != maxAnswers {
		t.Fatalf("%d answers kept, want the bound %d", len(a.by), maxAnswers)
	}
	for i := range 10 {
		if _, ok := a.get(key(i), mat, fuzzNow); ok {
			t.Fatalf("answer %d kept past the bound, although it is among the oldest", i)
		}
	}
	res, ok := a.get(key(maxAnswers+9), mat, fuzzNow)
	if !ok || !res.Leaf.Equal(leaf) || res.Generation != mat.Generation || res.Bundle != mat || len(res.Chain) != 1+len(mat.ChainPEMs()) {
		t.Fatalf("the newest answer: %v %+v", ok, res)
	}
	if _, ok := a.get(key(maxAnswers+9), nil, fuzzNow); ok {
		t.Fatal("an answer recorded under one CA material given under another")
	}
	if len(a.order)-a.head != maxAnswers {
		t.Fatalf("%d answers in order, want %d", len(a.order)-a.head, maxAnswers)
	}
	if _, ok := a.get(key(maxAnswers+9), mat, fuzzNow.Add(AnswerWindow)); ok || len(a.by) != 0 || a.head != len(a.order) {
		t.Fatalf("answers kept past AnswerWindow: %d", len(a.by))
	}
}

// TestAnswerKeysTellFieldsApart: the key hashes each field with its length, so
// moving bytes from one field to the next makes another key.
func TestAnswerKeysTellFieldsApart(t *testing.T) {
	csr := []byte("csr")
	keys := map[answerKey]string{}
	for name, k := range map[string]answerKey{
		"base":           newAnswerKey("ns/pod", "spiffe://td/ns/ns/sa/a", "", time.Hour, csr),
		"shifted holder": newAnswerKey("ns/po", "dspiffe://td/ns/ns/sa/a", "", time.Hour, csr),
		"shifted id":     newAnswerKey("ns/pod", "spiffe://td/ns/ns/sa/", "a", time.Hour, csr),
		"other ttl":      newAnswerKey("ns/pod", "spiffe://td/ns/ns/sa/a", "", time.Hour+1, csr),
		"other csr":      newAnswerKey("ns/pod", "spiffe://td/ns/ns/sa/a", "", time.Hour, []byte("csR")),
		"other resource": newAnswerKey("ns/pod", "spiffe://td/ns/ns/sa/a", "default", time.Hour, csr),
	} {
		if other, ok := keys[k]; ok {
			t.Fatalf("%s and %s have one key", name, other)
		}
		keys[k] = name
	}
}
