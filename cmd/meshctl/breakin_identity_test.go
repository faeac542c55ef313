package main

// The break-in suite across namespaces (issue 22): what a real cluster hands an
// attacker is the right to create a pod in *some* namespace and that pod's projected
// token. Pod names repeat across namespaces (web-0, redis-0), so the attacker names
// its pods after the victims: attacker/demo-0 and attacker/demo-1 beside the stack's
// default/demo-0 and default/demo-1. Every attack asserts on state: what the victim
// serves over SDS, what the attacker's subscriptions received, the rotator's
// schedule entries (its bucket, read with its own credential) and the inventory.

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The attacker's namespace and service account.
const evilNS, evilSA = "attacker", "evil"

func TestBreakInAcrossNamespaces(t *testing.T) {
	dir := testkit.ShortDir(t)
	r, _ := startStackLogged(t, devstack.Config{Dir: dir, Pods: 2, LeafTTL: time.Hour})
	h := &breakin{dir: dir, st: &r.Stack, admin: r.Conn(), keys: &keyRing{}}
	var err error
	if h.iss, err = devtoken.Load(dir + "/issuer"); err != nil {
		t.Fatal(err)
	}
	x := &nsAttack{breakin: h,
		rotator: h.jsOf(t, h.connRole(t, dir+"/secrets/"+string(policy.Rotator)+".nk", policy.Rotator, nil)),
		audit:   h.connRole(t, h.st.NATSAuditNKey, policy.Audit, nil)}
	// Both victims hold their first certificate and are scheduled.
	for _, p := range []events.PodRef{victimRef, attackerRef} {
		s := h.serving(t, p.Name)
		x.waitEntry(t, p, s.serial)
	}
	t.Run("anchors of the namesake", x.anchors)
	t.Run("renew commands and sign replies of the namesake", x.eavesdrop)
	t.Run("pod.down of the namesake", x.podDown)
	t.Run("a certificate for the namesake", x.certificate)
}

// nsAttack is the stack, the rotator's bucket and the audit view.
type nsAttack struct {
	*breakin
	rotator jetstream.JetStream
	audit   *nats.Conn
}

// evilPod connects as attacker/<name> with a token minted for that pod in the
// attacker's namespace, as the API server would mint it; the callout admits it.
func (x *nsAttack) evilPod(t *testing.T, name string, v *violations) *nats.Conn {
	t.Helper()
	tok, err := x.iss.MintForPod(evilNS, evilSA, name, devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := x.connToken(t, tok, events.PodRef{Namespace: evilNS, Name: name}, v)
	if err != nil {
		t.Fatalf("attacker/%s's own token refused: %v", name, err)
	}
	return nc
}

// entry is the rotator's schedule entry for pod's default certificate, from its
// bucket: ok false when there is none.
func (x *nsAttack) entry(t *testing.T, pod events.PodRef) (serial string, ok bool) {
	t.Helper()
	kv, err := x.rotator.KeyValue(ctxT(t, 5*time.Second), policy.BucketRotator)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding
	key := "e." + enc.EncodeToString([]byte(pod.String())) + "." + enc.EncodeToString([]byte("default"))
	e, err := kv.Get(ctxT(t, 5*time.Second), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Pod    string `json:"p"`
		Serial string `json:"s"`
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Pod != pod.String() {
		t.Fatalf("schedule entry %s: %s (%v)", key, e.Value(), err)
	}
	return rec.Serial, true
}

// waitEntry waits until the rotator's entry for pod is serial.
func (x *nsAttack) waitEntry(t *testing.T, pod events.PodRef, serial string) {
	t.Helper()
	testkit.EventuallyWithin(t, 20*time.Second, "the rotator's entry for "+pod.String()+" is "+serial, func() bool {
		got, ok := x.entry(t, pod)
		return ok && got == serial
	})
}

// record is pod's certificate record in the inventory (nil: none).
func (x *nsAttack) record(t *testing.T, pod events.PodRef) *inventory.Cert {
	t.Helper()
	snap, err := inventory.Read(ctxT(t, 10*time.Second), x.audit)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range snap.Certs {
		if c.Pod == pod.String() {
			return &c
		}
	}
	return nil
}

// anchors: attacker/demo-1 publishes extra trust anchors — on default/demo-1's
// subject, on the name-only subject of before, and on its own. default/demo-1's
// served ROOTCA keeps exactly its roots.
func (x *nsAttack) anchors(t *testing.T) {
	before := x.serving(t, attacker)
	var v violations
	evil := x.evilPod(t, attacker, &v)
	_, evilRoot := newCA(t, "cluster.local")
	roots := []string{string(pki.EncodeCertPEM(evilRoot))}
	victimAnchors, _ := events.PodAnchorsSubject(attackerRef)
	own, _ := events.PodAnchorsSubject(events.PodRef{Namespace: evilNS, Name: attacker})
	nameOnly := "meshagent.pod." + attacker + ".anchors"
	publish(t, evil, victimAnchors, events.TrustAnchors{Pod: attackerRef, Roots: roots})
	publish(t, evil, nameOnly, events.TrustAnchors{Pod: attackerRef, Roots: roots})
	publish(t, evil, own, events.TrustAnchors{Pod: attackerRef, Roots: roots}) // its own subject, the victim in the payload
	publish(t, evil, own, events.TrustAnchors{Pod: events.PodRef{Namespace: evilNS, Name: attacker}, Roots: roots})
	flush(t, evil)
	requireViolations(t, "attacker/demo-1", &v, victimAnchors, nameOnly)
	// A genuine change after the attack reaches default/demo-1 (a renewal it is told
	// of): had the anchors been taken, they would be served by then.
	renew, _ := events.PodRenewSubject(attackerRef)
	publish(t, x.admin, renew, events.RenewDue{Pod: attackerRef, Resource: "default", Reason: events.RenewForced})
	var after served
	testkit.EventuallyWithin(t, 30*time.Second, "default/demo-1 renewed after the attack", func() bool {
		after = x.serving(t, attacker)
		return after.serial != before.serial
	})
	evilFP := pki.Fingerprint(evilRoot)
	for _, fp := range after.rootCA {
		if fp == evilFP {
			t.Fatalf("default/demo-1 serves the attacker's root in ROOTCA: %v", after.rootCA)
		}
	}
	if !sameSet(after.rootCA, before.rootCA) {
		t.Fatalf("default/demo-1's ROOTCA changed: %v -> %v", before.rootCA, after.rootCA)
	}
}

// eavesdrop: attacker/demo-0 listens for default/demo-0's renew commands and sign
// replies while default/demo-0 is told to renew and does; it receives none.
func (x *nsAttack) eavesdrop(t *testing.T) {
	var v violations
	evil := x.evilPod(t, victim, &v)
	victimRenew, _ := events.PodRenewSubject(victimRef)
	victimInbox := policy.Inbox(policy.Pod, victimRef) + ".>"
	var ls []*listener
	for _, s := range []string{victimRenew, "meshagent.pod.*." + victim + ".>", "meshagent.pod." + victim + ".>",
		victimInbox, "_INBOX.pod.*." + victim + ".>", "_INBOX.pod." + victim + ".>", "_INBOX.>", ">"} {
		ls = append(ls, listen(t, "attacker/demo-0", evil, s, ""))
	}
	own, _ := events.PodRenewSubject(events.PodRef{Namespace: evilNS, Name: victim})
	ownRenews := listen(t, "attacker/demo-0", evil, own, "")
	flush(t, evil)
	requireViolations(t, "attacker/demo-0", &v, victimRenew, victimInbox, "_INBOX.>", ">")

	before := x.serving(t, victim)
	renewed := x.tapRenewals(t, victimRef)
	publish(t, x.admin, victimRenew, events.RenewDue{Pod: victimRef, Resource: "default", Reason: events.RenewForced})
	var after served
	testkit.EventuallyWithin(t, 30*time.Second, "default/demo-0 renewed (a renew command and a sign reply)", func() bool {
		after = x.serving(t, victim)
		return after.serial != before.serial
	})
	x.waitEntry(t, victimRef, after.serial)
	flush(t, evil)
	if renewed.got.Load() == 0 {
		t.Fatal("the renew command to default/demo-0 was not seen on its subject: the attack proved nothing")
	}
	for _, l := range append(ls, ownRenews) {
		if n := l.got.Load(); n != 0 {
			t.Errorf("attacker/demo-0 received %d messages on %s (first on %v)", n, l.subject, l.first.Load())
		}
	}
}

// tapRenewals listens to pod's renew subject with pod's own token (no role but the
// pod may read it).
func (x *nsAttack) tapRenewals(t *testing.T, pod events.PodRef) *listener {
	t.Helper()
	tok, err := os.ReadFile(x.podInfo(pod.Name).TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	podConn, err := x.connToken(t, string(tok), pod, nil)
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := events.PodRenewSubject(pod)
	l := listen(t, pod.String(), podConn, subj, "")
	flush(t, podConn)
	return l
}

// podDown: attacker/demo-0 says default/demo-0 stopped — on default/demo-0's
// subject, and on its own with default/demo-0 in the payload — then stops itself.
// The rotator keeps default/demo-0's entry and the inventory does not mark it down.
func (x *nsAttack) podDown(t *testing.T) {
	var v violations
	evil := x.evilPod(t, victim, &v)
	evilRef := events.PodRef{Namespace: evilNS, Name: victim}
	// attacker/demo-0 holds a certificate, so that the inventory has a record of it
	// whose pod.down shows the inventory has read up to the attack.
	x.waitEntry(t, evilRef, x.evilCert(t, evil, victim))
	testkit.EventuallyWithin(t, 20*time.Second, "the inventory holds attacker/demo-0", func() bool { return x.record(t, evilRef) != nil })
	serial, ok := x.entry(t, victimRef)
	if !ok {
		t.Fatal("default/demo-0 is not scheduled before the attack")
	}
	rot := x.st.Rotator.HTTP
	rejected := `meshagent_rotator_events_total{kind="pod.down",result="rejected"}`
	retired := `meshagent_rotator_events_total{kind="pod.down",result="retired"}`
	rejectedBefore, retiredBefore := metric(t, rot, rejected), metric(t, rot, retired)

	victimDown, _ := events.PodEventSubject(victimRef, events.PodEventDown)
	ownDown, _ := events.PodEventSubject(evilRef, events.PodEventDown)
	publish(t, evil, victimDown, events.PodDown{Pod: victimRef, Reason: "deleted"})
	publish(t, evil, ownDown, events.PodDown{Pod: victimRef, Reason: "deleted"})
	publish(t, evil, ownDown, events.PodDown{Pod: evilRef, Reason: "shutdown"})
	flush(t, evil)
	requireViolations(t, "attacker/demo-0", &v, victimDown)
	testkit.EventuallyWithin(t, 20*time.Second, "the rotator refused the pod.down naming default/demo-0 and took attacker/demo-0's own", func() bool {
		return metric(t, rot, rejected) == rejectedBefore+1 && metric(t, rot, retired) == retiredBefore+1
	})
	if got, ok := x.entry(t, victimRef); !ok || got != serial {
		t.Fatalf("default/demo-0's schedule entry is %q (present %v), want %s", got, ok, serial)
	}
	if _, ok := x.entry(t, evilRef); ok {
		t.Fatal("attacker/demo-0's own pod.down left its entry")
	}
	// The inventory read the forged pod.down before the attacker's own, which marks
	// attacker/demo-0's record down; default/demo-0's is still up.
	testkit.EventuallyWithin(t, 20*time.Second, "the inventory took attacker/demo-0's own pod.down", func() bool {
		c := x.record(t, evilRef)
		return c != nil && c.Down
	})
	if c := x.record(t, victimRef); c == nil || c.Down {
		t.Fatalf("the inventory marks default/demo-0 down: %+v", c)
	}
}

// evilCert gets attacker/<name> (connected as nc) a certificate of its own
// identity, on its identity sign subject (sign.id.attacker.evil.<name>); it returns
// the leaf's serial.
func (x *nsAttack) evilCert(t *testing.T, nc *nats.Conn, name string) string {
	t.Helper()
	pod := events.PodRef{Namespace: evilNS, Name: name}
	tok, err := x.iss.MintForPod(evilNS, evilSA, name, devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	csr := newCSR(t, "spiffe://cluster.local/ns/"+evilNS+"/sa/"+evilSA)
	idSubject, _ := events.IdentitySignSubject(pod, evilSA)
	reply, err := request[events.SignReply](t, nc, idSubject, events.SignRequest{CSR: csr, Token: tok, Pod: pod})
	if err != nil || reply.Error != nil || len(reply.CertChain) == 0 {
		t.Fatalf("%s's own certificate: %v %+v", pod, err, reply.Error)
	}
	leaf, err := pki.ParseCertsPEM([]byte(reply.CertChain[0]))
	if err != nil {
		t.Fatal(err)
	}
	return pki.SerialHex(leaf[0])
}

// certificate: attacker/demo-1 gets a certificate of its own identity on its
// identity sign subject (sign.id.attacker.evil.demo-1). It is scheduled as
// attacker/demo-1's; default/demo-1's entry, and what it serves, stay.
func (x *nsAttack) certificate(t *testing.T) {
	evil := x.evilPod(t, attacker, nil)
	evilRef := events.PodRef{Namespace: evilNS, Name: attacker}
	served := x.serving(t, attacker)
	x.waitEntry(t, attackerRef, served.serial)

	// Scheduled as attacker/demo-1's own entry ...
	x.waitEntry(t, evilRef, x.evilCert(t, evil, attacker))
	// ... and default/demo-1's is the certificate it serves, as before.
	if got, ok := x.entry(t, attackerRef); !ok || got != served.serial {
		t.Fatalf("default/demo-1's schedule entry is %q (present %v), want its own %s", got, ok, served.serial)
	}
	if now := x.serving(t, attacker); now.serial != served.serial {
		t.Fatalf("default/demo-1 serves %s, had %s", now.serial, served.serial)
	}
	// Asking for a certificate recorded for default/demo-1 with the attacker's
	// token: refused, and nothing is scheduled for it.
	tok, err := x.iss.MintForPod(evilNS, evilSA, attacker, devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	csr := newCSR(t, "spiffe://cluster.local/ns/"+evilNS+"/sa/"+evilSA)
	podSubject, _ := events.PodSignSubject(evilRef)
	reply, err := request[events.SignReply](t, evil, podSubject, events.SignRequest{CSR: csr, Token: tok, Pod: attackerRef})
	if err != nil || reply.Error == nil || reply.Error.Code != events.CodePermissionDenied {
		t.Fatalf("a certificate for default/demo-1 with attacker/demo-1's token: %v %+v", err, reply.Error)
	}
	if got, ok := x.entry(t, attackerRef); !ok || got != served.serial {
		t.Fatalf("default/demo-1's schedule entry is %q (present %v), want its own %s", got, ok, served.serial)
	}
}
