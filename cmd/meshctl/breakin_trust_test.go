package main

// Break-in: the trust bundle and the root — forging trust.changed, rotating the root
// without being the operator, too often or past the bundle's cap, and making the
// signer write its replies into its own state.

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// replyIntoState: a request's reply subject is the requester's choice, and the
// signer may publish into its own CA bucket and events. A request whose reply
// subject names them must not make the signer write there.
func (h *breakin) replyIntoState(t *testing.T) {
	ca := h.caState(t)
	trust, issued := h.stored(t, events.SubjectTrustChanged), h.stored(t, events.SubjectCertIssued)
	attackerSign := h.signSubject(attackerRef)
	targets := []string{
		"$KV." + policy.BucketCA + ".root",
		"$KV." + policy.BucketCA + ".evil",
		events.SubjectTrustChanged,
		events.SubjectCertIssued,
		"$JS.API.STREAM.UPDATE." + events.StreamEvents,
	}
	send := func(nc *nats.Conn, subject string, p events.Payload) {
		for _, reply := range targets {
			m, err := events.NewMsgOn(subject, "breakin", p)
			if err != nil {
				t.Fatal(err)
			}
			m.Reply = reply
			if err := nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, nc)
	}
	send(h.pod, events.SubjectTrustBundle, events.BundleRequest{})
	send(h.pod, attackerSign, events.SignRequest{CSR: newCSR(t, "spiffe://cluster.local/ns/default/sa/demo"), Token: "x"})
	send(h.admin, events.SubjectTrustBundle, events.BundleRequest{})
	// The signer answers in order per worker; a bundle request answered after all of
	// the above (several times, to pass every worker) bounds how long to wait.
	for range 8 {
		h.bundle(t)
	}
	if got := h.caState(t); got != ca {
		t.Errorf("the CA bucket moved from sequence %d to %d", ca, got)
	}
	if got := h.stored(t, events.SubjectTrustChanged); got != trust {
		t.Errorf("%d messages were stored as trust.changed", got-trust)
	}
	if got := h.stored(t, events.SubjectCertIssued); got != issued {
		t.Errorf("%d messages were stored as cert.issued", got-issued)
	}
	h.eventStreamUnchanged(t)
}

// widenEventStream: whoever may update MESHAGENT_EVENTS could make it capture sign
// requests (and their tokens, for every reader of the stream) or source the CA
// bucket; nobody but the signer may, not even the operator, and the stream keeps its
// subjects.
func (h *breakin) widenEventStream(t *testing.T) {
	adminErrs := &violations{}
	admin := h.connRole(t, h.st.NATSAdminNKey, policy.Admin, adminErrs)
	for _, who := range []struct {
		name string
		nc   *nats.Conn
		v    *violations
	}{{"audit", h.audit, h.auditErrs}, {"pod", h.pod, h.podErrs}, {"admin", admin, adminErrs}} {
		tryAll(t, who.name, who.nc, []attempt{
			{"$JS.API.STREAM.UPDATE." + events.StreamEvents, `{"name":"` + events.StreamEvents + `","subjects":["meshagent.evt.>","meshagent.rpc.sign.>"]}`},
			{"$JS.API.STREAM.UPDATE." + events.StreamPodEvents, `{"name":"` + events.StreamPodEvents + `","subjects":["meshagent.evt.pod.>"],"max_msgs_per_subject":-1}`},
			{"$JS.API.STREAM.CREATE.TOKENS", `{"name":"TOKENS","storage":"memory","subjects":["meshagent.rpc.sign.>"]}`},
		})
		requireViolations(t, who.name, who.v, "$JS.API.STREAM.UPDATE."+events.StreamEvents, "$JS.API.STREAM.UPDATE."+events.StreamPodEvents, "$JS.API.STREAM.CREATE.TOKENS")
	}
	h.eventStreamUnchanged(t)
}

// eventStreamUnchanged checks MESHAGENT_EVENTS still holds the CA's events only,
// and MESHAGENT_POD_EVENTS the pods' with their bounds.
func (h *breakin) eventStreamUnchanged(t *testing.T) {
	t.Helper()
	s, err := h.events.Stream(ctxT(t, 5*time.Second), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Config; !slices.Equal(c.Subjects, events.CAEventSubjects) || len(c.Sources) != 0 || c.Mirror != nil || c.RePublish != nil {
		t.Fatalf("MESHAGENT_EVENTS was reconfigured: subjects %v, sources %v, mirror %v, republish %v", c.Subjects, c.Sources, c.Mirror, c.RePublish)
	}
	ps, err := h.events.Stream(ctxT(t, 5*time.Second), events.StreamPodEvents)
	if err != nil {
		t.Fatal(err)
	}
	pinfo, err := ps.Info(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if c := pinfo.Config; !slices.Equal(c.Subjects, []string{events.PodEventsWildcard}) || c.MaxMsgsPerSubject != bus.DefaultPodEventsMaxMsgsPerSubject ||
		len(c.Sources) != 0 || c.Mirror != nil || c.RePublish != nil {
		t.Fatalf("MESHAGENT_POD_EVENTS was reconfigured: subjects %v, per subject %d, sources %v", c.Subjects, c.MaxMsgsPerSubject, c.Sources)
	}
}

// forgeTrustChanged: an attacker's root, unendorsed or endorsed with the attacker's
// own key, reaches no pod; even with the signer's bus credential (leaked), the pods
// and the rotator refuse it. A genuine rotation still applies everywhere, and the
// rotator still renews demo-0 after the lies it was told.
func (h *breakin) forgeTrustChanged(t *testing.T) {
	b := h.bundle(t)
	stored := h.stored(t, events.SubjectTrustChanged)
	bundleFile, err := os.ReadFile(h.st.TrustBundle)
	if err != nil {
		t.Fatal(err)
	}
	before := map[string]served{}
	for _, p := range h.st.Pods {
		before[p.ID] = h.serving(t, p.ID)
	}
	key, root := newCA(t, h.st.TrustDomain)
	roots := append([]string{string(pki.EncodeCertPEM(root))}, b.Roots...)
	gen := b.Generation + 1
	msg, err := events.EndorsedBytes(h.st.TrustDomain, gen, roots)
	if err != nil {
		t.Fatal(err)
	}
	kid, sig, err := pki.Endorse(key, msg)
	if err != nil {
		t.Fatal(err)
	}
	unendorsed := events.TrustChanged{TrustDomain: h.st.TrustDomain, Roots: roots, Added: []string{pki.Fingerprint(root)},
		Reason: events.TrustReasonRotation, Generation: gen}
	selfEndorsed := unendorsed
	selfEndorsed.Endorsements = []events.Endorsement{{KeyID: kid, Signature: sig}}
	// The attacker's root endorsing itself with a chain of itself.
	chained := selfEndorsed
	chained.Endorsements = []events.Endorsement{{KeyID: kid, Signature: sig, Chain: []string{string(pki.EncodeCertPEM(root))}}}
	forgeries := []events.TrustChanged{unendorsed, selfEndorsed, chained}

	for _, who := range []struct {
		name string
		nc   *nats.Conn
		v    *violations
	}{{"audit", h.audit, h.auditErrs}, {"pod", h.pod, h.podErrs}} {
		for _, f := range forgeries {
			publish(t, who.nc, events.SubjectTrustChanged, f)
		}
		flush(t, who.nc)
		requireViolations(t, who.name, who.v, events.SubjectTrustChanged)
	}
	if got := h.stored(t, events.SubjectTrustChanged); got != stored {
		t.Fatalf("%d forged trust.changed were stored", got-stored)
	}

	// A leaked signer credential gets them onto the bus; every receiver checks them.
	t.Run("with the signer's credential", func(t *testing.T) {
		rejected := `meshagent_sds_edge_trust_rejected_total{source="trust.changed"}`
		rotRejected := `meshagent_rotator_events_total{kind="trust.changed",result="rejected"}`
		edgeBefore := map[string]float64{}
		for _, p := range h.st.Pods {
			edgeBefore[p.ID] = metric(t, p.HTTP["sds-edge"], rejected)
		}
		rotBefore := metric(t, h.st.Rotator.HTTP, rotRejected)
		refusedBefore := strings.Count(h.meshctlLog.String(), "trust.changed refused")
		for _, f := range forgeries {
			publish(t, h.signer, events.SubjectTrustChanged, f)
		}
		flush(t, h.signer)
		for _, p := range h.st.Pods {
			testkit.EventuallyWithin(t, 10*time.Second, fmt.Sprintf("%s did not refuse the forged trust.changed", p.ID), func() bool {
				return metric(t, p.HTTP["sds-edge"], rejected) >= edgeBefore[p.ID]+float64(len(forgeries))
			})
		}
		testkit.EventuallyWithin(t, 10*time.Second, "the rotator did not refuse the forged trust.changed", func() bool { return metric(t, h.st.Rotator.HTTP, rotRejected) >= rotBefore+float64(len(forgeries)) })
		// meshctl's own bundle writer has judged them all once it has refused as many.
		testkit.EventuallyWithin(t, 10*time.Second, "meshctl's bundle writer refusing the forged trust.changed", func() bool {
			return strings.Count(h.meshctlLog.String(), "trust.changed refused") >= refusedBefore+len(forgeries)
		})
		if now, err := os.ReadFile(h.st.TrustBundle); err != nil || !bytes.Equal(now, bundleFile) {
			t.Errorf("meshctl's trust-bundle.pem changed on a forged trust.changed (%v)", err)
		}
	})
	for _, p := range h.st.Pods {
		after := h.serving(t, p.ID)
		if !sameSet(after.rootCA, before[p.ID].rootCA) || after.serial != before[p.ID].serial {
			t.Fatalf("%s changed on forgeries: %+v -> %+v", p.ID, before[p.ID], after)
		}
	}
	if got := h.bundle(t).Generation; got != b.Generation {
		t.Fatalf("bundle generation %d -> %d", b.Generation, got)
	}

	// The genuine rotation (the full run's first, with a new key) still applies.
	renewed := h.tap.renewsSent(victimRef, events.RenewRootRotation)
	fp := h.rotate(t, true)
	h.followed(t, fp)
	if h.tap.renewsSent(victimRef, events.RenewRootRotation) <= renewed {
		t.Fatal("the rotator did not renew demo-0 at the root rotation: it believed a lie")
	}
}

// rotate rotates the root as the operator (meshctl rotate root), waiting out the
// rate limit, and returns the new root's fingerprint.
func (h *breakin) rotate(t *testing.T, newKey bool) string {
	t.Helper()
	args := []string{"rotate", "-dir", h.dir, "root"}
	if newKey {
		args = append(args, "-new-key")
	}
	var out string
	var err error
	testkit.EventuallyWithin(t, 3*rotateMin+5*time.Second, "rotate root: still too soon", func() bool {
		out, err = meshctl(t, args...)
		return err == nil || !strings.Contains(err.Error(), "allowed at")
	})
	if err != nil {
		t.Fatalf("rotate root: %v\n%s", err, out)
	}
	fp := rotatedRoot(out)
	if fp == "" {
		t.Fatalf("rotate root printed %q", out)
	}
	return fp
}

// followed waits until every pod trusts root fp and serves a leaf under it.
func (h *breakin) followed(t *testing.T, fp string) {
	t.Helper()
	for _, p := range h.st.Pods {
		testkit.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("%s did not follow the rotation to %s", p.ID, fp), func() bool {
			s := h.serving(t, p.ID)
			return s.root == fp && contains(s.rootCA, fp)
		})
	}
}

func contains(s []string, x string) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

// rotateRoot: only the operator rotates, and not more often than the rate limit.
func (h *breakin) rotateRoot(t *testing.T) {
	gen, ca := h.bundle(t).Generation, h.caState(t)
	for _, who := range []struct {
		name string
		nc   *nats.Conn
		v    *violations
	}{{"audit", h.audit, h.auditErrs}, {"pod", h.pod, h.podErrs}} {
		if r, err := request[events.RotateReply](t, who.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true}); err == nil {
			t.Errorf("%s: rotation answered: %+v", who.name, r)
		}
		requireViolations(t, who.name, who.v, events.SubjectRootRotate)
	}
	if h.bundle(t).Generation != gen || h.caState(t) != ca {
		t.Fatal("the root changed")
	}
	// The full run's second rotation (same key), then one within the rate limit.
	fp := h.rotate(t, false)
	gen, ca = h.bundle(t).Generation, h.caState(t)
	r, err := request[events.RotateReply](t, h.admin, events.SubjectRootRotate, events.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Error == nil || r.Error.Code != events.CodeResourceExhausted {
		t.Fatalf("a rotation within %s: %+v", rotateMin, r)
	}
	if h.bundle(t).Generation != gen || h.caState(t) != ca {
		t.Fatal("a refused rotation changed the root")
	}
	h.followed(t, fp)
}

// growBundle: rotating again and again stops at the bundle's cap, and signing, the
// replies and events that carry the whole bundle, keeps working.
func (h *breakin) growBundle(t *testing.T) {
	if testing.Short() {
		t.Skip("rotates the root up to the cap, waiting out the rate limit each time")
	}
	var refused *events.ReplyError
	for i := 0; refused == nil; i++ {
		if i > 10 {
			t.Fatal("still rotating after 10 rotations: no cap")
		}
		var r events.RotateReply
		testkit.EventuallyWithin(t, 3*rotateMin+5*time.Second, "rotation: still too soon", func() bool {
			var err error
			r, err = request[events.RotateReply](t, h.admin, events.SubjectRootRotate, events.RotateRequest{})
			return err == nil && (r.Error == nil || !strings.Contains(r.Error.Message, "allowed at"))
		})
		refused = r.Error
	}
	if refused.Code != events.CodeResourceExhausted {
		t.Fatalf("rotation past the cap: %+v", refused)
	}
	b := h.bundle(t)
	if len(b.Roots) > 8 {
		t.Fatalf("the bundle holds %d roots", len(b.Roots))
	}
	// Signing still works, over NATS and gRPC, for meshctl and for the pods.
	for _, extra := range [][]string{nil, {"-grpc"}} {
		if out, err := meshctl(t, append([]string{"sign", "-dir", h.dir, "-ns", "prod", "-sa", "web"}, extra...)...); err != nil {
			t.Fatalf("sign %v with a full bundle: %v\n%s", extra, err, out)
		}
	}
	c, err := pki.ParseCertsPEM([]byte(b.Roots[0]))
	if err != nil {
		t.Fatal(err)
	}
	h.followed(t, pki.Fingerprint(c[0]))
	before := h.serving(t, victim)
	if out, err := meshctl(t, "rotate", "-dir", h.dir, "pod", victim); err != nil {
		t.Fatalf("forced renewal: %v\n%s", err, out)
	}
	testkit.EventuallyWithin(t, 30*time.Second, "demo-0 was not renewed with a full bundle", func() bool { return h.serving(t, victim).serial != before.serial })
	if h.bundle(t).Generation != b.Generation {
		t.Fatal("the bundle changed after the refusal")
	}
}
