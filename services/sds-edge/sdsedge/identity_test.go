package sdsedge_test

import (
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// renewAbout publishes a renew-due naming serial, valid until notAfter.
func renewAbout(t testing.TB, nc *nats.Conn, serial string, notAfter time.Time) {
	t.Helper()
	subj, _ := events.PodRenewSubject(testPodRef)
	msg, err := events.NewMsg(subj, "test-rotator", events.RenewDue{Pod: testPodRef, Serial: serial, NotAfter: notAfter, Reason: events.RenewScheduled})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// After a lost sign reply the rotator's record is a newer certificate the pod never
// got: a renew-due naming it must renew, while one about an older certificate is
// dropped.
func TestRenewDueForUnknownNewerCertificate(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	def := p.open(t, p.dial(t), "default")
	leaf := leafOf(t, recv(t, def).Secrets["default"])
	before := v.ca.requests.Load()

	renewAbout(t, v.nc, "0badc0ffee", leaf.NotAfter.Add(-time.Hour)) // older, already replaced: dropped
	renewAbout(t, v.nc, "0feedface", leaf.NotAfter.Add(time.Minute)) // newer, never received: renews
	next := leafOf(t, recv(t, def).Secrets["default"])
	if pki.SerialHex(next) == pki.SerialHex(leaf) {
		t.Fatal("renewal pushed the same certificate")
	}
	if got := v.ca.requests.Load() - before; got != 1 {
		t.Fatalf("%d CSRs after an older and a newer unknown renew-due, want 1", got)
	}

	// Every later renew-due about the rotator's newer certificate (a retry, with
	// its own event id) is obeyed too, not ignored until the safety deadline.
	renewAbout(t, v.nc, "0feedface", next.NotAfter.Add(time.Minute))
	third := leafOf(t, recv(t, def).Secrets["default"])
	if pki.SerialHex(third) == pki.SerialHex(next) {
		t.Fatal("second renewal pushed the same certificate")
	}
}

// A responder on the sign subject that hands out a certificate for another SPIFFE
// ID is a signing failure: the pod retries and never serves that identity.
func TestSignReplyForAnotherIdentityIsRejected(t *testing.T) {
	v := newEnv(t)
	rogue := "spiffe://cluster.local/ns/kube-system/sa/admin"
	v.ca.rogueID.Store(&rogue)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "default")
	testkit.Eventually(t, "rogue replies rejected and retried", func() bool {
		return v.ca.requests.Load() >= 3 && p.metric(t, "meshagent_sds_edge_csr_failed_total") >= 2 && p.metric(t, "meshagent_sds_edge_csr_retried_total") >= 1
	})
	v.ca.rogueID.Store(nil)
	leaf := leafOf(t, recv(t, st).Secrets["default"])
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/web" {
		t.Fatalf("first certificate served is for %v, want the pod's own identity", leaf.URIs)
	}
}

// A trust.changed with generation 0 after generation 5 is old news: it must not
// change the roots nor reset the counter (so a later generation 3 is still stale).
func TestTrustChangedGenerationZeroIsIgnoredAfterOthers(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st := p.open(t, p.dial(t), "ROOTCA")
	recv(t, st)
	publish := func(gen uint64, roots []*x509.Certificate, removed ...string) {
		t.Helper()
		msg, err := events.NewMsg(events.SubjectTrustChanged, "test-ca", v.ca.trustChanged(t, gen, pki.CertPEMs(roots), removed...))
		if err != nil {
			t.Fatal(err)
		}
		if err := v.nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	r0 := v.ca.roots[0]
	r1 := v.ca.rotate(t)
	publish(5, []*x509.Certificate{r1, r0})
	if n := len(rootsOf(t, recv(t, st).Secrets["ROOTCA"].TrustedCA)); n != 2 {
		t.Fatalf("%d roots after generation 5, want 2", n)
	}
	r2, r3, r4 := newTestCA(t).roots[0], newTestCA(t).roots[0], newTestCA(t).roots[0]
	publish(0, []*x509.Certificate{r2}, pki.Fingerprint(r1)) // ignored
	publish(3, []*x509.Certificate{r3})                      // stale, unless 0 reset the counter
	publish(6, []*x509.Certificate{r4})                      // applied
	got := rootsOf(t, recv(t, st).Secrets["ROOTCA"].TrustedCA)
	want := map[string]string{pki.Fingerprint(r4): "r4", pki.Fingerprint(r1): "r1", pki.Fingerprint(r0): "r0"}
	if len(got) != len(want) {
		t.Fatalf("ROOTCA = %v, want r4, r1, r0", names(got, r2, r3))
	}
	for fp := range want {
		if !got[fp] {
			t.Fatalf("ROOTCA = %v, want r4, r1, r0", names(got, r2, r3))
		}
	}
}

func rootsOf(t testing.TB, pemBytes []byte) map[string]bool {
	t.Helper()
	certs, err := pki.ParseCertsPEM(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, c := range certs {
		out[pki.Fingerprint(c)] = true
	}
	return out
}

func names(got map[string]bool, r2, r3 *x509.Certificate) string {
	s := fmt.Sprintf("%d roots", len(got))
	if got[pki.Fingerprint(r2)] {
		s += ", r2 (generation 0)"
	}
	if got[pki.Fingerprint(r3)] {
		s += ", r3 (generation 3)"
	}
	return s
}
