package renewal

import (
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// Across a rotation to a new key the rotator schedules the record of every phase:
// as the signer publishes it (the leaf and the chain under the signing key's own
// root, RootFingerprint that root) and with the reply's whole chain (cross-signed
// certificate and the phase's last PEM) in it. None is rejected.
func TestRecordsOfEveryRotationPhaseAreScheduled(t *testing.T) {
	h, r := newLeader(t)
	now := h.clk.Now()
	rot := testkit.NewRotation(t, now.Add(-24*time.Hour), 30*24*time.Hour)
	h.ca.adopt("old", rot.Old)
	testkit.Eventually(t, "bundle trusted", func() bool { return r.trust.Bootstrapped() })
	n := 0
	for phase := testkit.PhaseBefore; phase <= testkit.PhaseSettled; phase++ {
		if phase == testkit.PhaseOldLast {
			h.ca.adopt("new", rot.New)
			h.publish(events.SubjectTrustChanged, h.ca.trustChanged(t, 2, "new", "old"))
		}
		signer := rot.Signer(phase)
		for _, whole := range []bool{false, true} {
			n++
			pod, serial := fmt.Sprintf("web-%d", n), fmt.Sprintf("%02x", n)
			id := "spiffe://cluster.local/ns/default/sa/" + pod
			leaf := signer.Issue(t, leafSpec(t, id, serial, now, time.Hour)).Cert
			chain := []*x509.Certificate{leaf}
			if whole {
				chain = append(chain, rot.Above(phase)...)
			}
			ev := events.CertIssued{Serial: serial, SPIFFEID: id, NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, Pod: events.PodRef{Namespace: "default", Name: pod},
				Resource: "default", KeyAlgorithm: "EC-P256", AuthSource: "jwt", Signer: "signer-0",
				RootFingerprint: pki.Fingerprint(signer.Cert), CertChain: pki.CertPEMs(chain)}
			h.publishAt(events.SubjectCertIssued, ev, now)
			waitScheduled(t, r, n)
			if rec, _ := r.Record("default/"+pod, "default"); rec.Root != pki.Fingerprint(signer.Cert) {
				t.Fatalf("phase %d (whole chain %t): scheduled under root %.16s", phase, whole, rec.Root)
			}
		}
	}
	for _, reason := range []string{reasonNoChain, reasonBadChain, reasonMismatch, reasonUntrusted} {
		if c := counter(t, r.m.certRejected.WithLabelValues(reason)); c != 0 {
			t.Errorf("%v records rejected as %s", c, reason)
		}
	}
}
