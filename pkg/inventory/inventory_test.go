package inventory_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func issued(pod string, gen int) events.CertIssued {
	nb := t0.Add(time.Duration(gen) * time.Minute)
	return events.CertIssued{Serial: fmt.Sprintf("%s%02x", "abcdef", gen), SPIFFEID: "spiffe://td/ns/default/sa/" + pod, NotBefore: nb,
		NotAfter: nb.Add(2 * time.Minute), Pod: events.PodRef{Namespace: "default", Name: pod}, Resource: "default", KeyAlgorithm: "EC-P256", AuthSource: "jwt",
		Signer: "signer-0", RootFingerprint: "root1"}
}

func meta(at time.Time) events.Meta {
	return events.Meta{ID: events.NewID(), Type: "t", Source: "s", Time: at}
}

func TestApplyIsIdempotentAndKeepsTheNewest(t *testing.T) {
	var c *inventory.Cert
	var changed bool
	c, changed = inventory.Apply(c, issued("p", 1), meta(t0))
	if !changed || c.Serial != "abcdef01" || c.Renewals != 0 {
		t.Fatalf("first certificate: %+v %v", c, changed)
	}
	if _, changed = inventory.Apply(c, issued("p", 1), meta(t0)); changed {
		t.Fatal("the same cert.issued twice changed the record")
	}
	c, _ = inventory.Apply(c, issued("p", 3), meta(t0.Add(3*time.Minute)))
	if _, changed = inventory.Apply(c, issued("p", 2), meta(t0.Add(2*time.Minute))); changed {
		t.Fatal("an older certificate replaced a newer one")
	}
	if c.Serial != "abcdef03" || c.Renewals != 1 {
		t.Fatalf("after a renewal: %+v", c)
	}
	push := events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "p"}, Resource: "default", Serial: "ABCDEF03", Version: "7", Streams: 2, Kind: "pushed"}
	c, changed = inventory.Apply(c, push, meta(t0.Add(4*time.Minute)))
	if !changed || c.Streams != 2 || c.Version != "7" {
		t.Fatalf("push not recorded: %+v", c)
	}
	if _, changed = inventory.Apply(c, push, meta(t0.Add(4*time.Minute))); changed {
		t.Fatal("the same push twice changed the record")
	}
	c, changed = inventory.Apply(c, events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "p"}, Reason: "shutdown"}, meta(t0.Add(5*time.Minute)))
	if !changed || !c.Down {
		t.Fatalf("pod.down not recorded: %+v", c)
	}
	if w := c.Warnings(t0.Add(time.Hour), nil); len(w) != 0 {
		t.Fatalf("a pod that stopped needs no attention, got %v", w)
	}
	c.Down = false
	if w := c.Warnings(t0.Add(time.Hour), nil); len(w) != 1 || w[0] != "expired" {
		t.Fatalf("warnings of an expired certificate: %v", w)
	}
	if w := c.Warnings(c.NotBefore.Add(100*time.Second), &inventory.Trust{Roots: []inventory.Root{{Fingerprint: "root2"}}}); len(w) != 2 {
		t.Fatalf("want overdue and root not in bundle, got %v", w)
	}
}

func selfSigned(t *testing.T) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"}, NotBefore: t0,
		NotAfter: t0.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return string(pki.EncodeCertPEM(c)), pki.Fingerprint(c)
}

func publish(t *testing.T, nc *nats.Conn, subject string, p events.Payload, at time.Time) {
	t.Helper()
	m := events.Meta{ID: events.NewID(), Source: "test", Time: at}
	msg, err := events.Encode(subject, m, p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bus.Publish(ctx, bustest.JetStream(t, nc), msg); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// TestKeepersShareTheDurable: two keepers (two operator replicas) on the secured
// bus, as the inventory role, fold events published out of order; the inventory an
// auditor reads ends as if one keeper had read them in order.
func TestKeepersShareTheDurable(t *testing.T) {
	m := bustest.SecureServer(t)
	m.ServeCallout(t, bustest.PodTokens)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	if _, err := bus.EnsureEventStream(ctx, bustest.JetStream(t, signer), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	rootPEM, rootFP := selfSigned(t)
	if _, err := signer.QueueSubscribe(events.SubjectTrustBundle, events.SignerQueue, func(msg *nats.Msg) {
		r, _ := events.NewMsg(msg.Reply, "signer", events.BundleReply{TrustDomain: "td", Roots: []string{rootPEM}, Generation: 3})
		_ = signer.PublishMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	// Five pods, four certificates each, published in a random order.
	type ev struct {
		p  events.CertIssued
		at time.Time
	}
	var all []ev
	for i := range 5 {
		for gen := 1; gen <= 4; gen++ {
			c := issued(fmt.Sprintf("pod-%d", i), gen)
			all = append(all, ev{c, c.NotBefore})
		}
	}
	mrand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	var errs bustest.Errors
	for i := range 2 {
		nc := m.Conn(t, policy.Inventory, &errs)
		k, err := inventory.NewKeeper(ctx, nc, 1, clock.Real{}, hclog.NewNullLogger().Named(fmt.Sprint(i)))
		if err != nil {
			t.Fatalf("keeper %d: %v %v", i, err, errs.All())
		}
		kctx, kcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- k.Run(kctx) }()
		t.Cleanup(func() {
			kcancel()
			if err := <-done; err != nil {
				t.Errorf("keeper %d: %v", i, err)
			}
		})
	}
	for _, e := range all {
		publish(t, signer, events.SubjectCertIssued, e.p, e.at)
	}
	// pod-0 pushes its newest certificate and stops: pod events come from the pod.
	pod, err := m.PodConn(t, events.PodRef{Namespace: "default", Name: "pod-0"}, "pod:pod-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	// attacker/pod-1, a pod of another namespace with pod-1's name, says default/pod-1
	// stopped: on its own subject (the only one the bus lets it use) with
	// default/pod-1 in the payload, and as itself. Neither touches default/pod-1.
	evil := events.PodRef{Namespace: "attacker", Name: "pod-1"}
	attacker, err := m.PodConn(t, evil, "pod:attacker/pod-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	evilDown, _ := events.PodEventSubject(evil, events.PodEventDown)
	evilPushed, _ := events.PodEventSubject(evil, events.PodEventSecretPushed)
	publish(t, attacker, evilDown, events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "pod-1"}, Reason: "forged"}, t0.Add(7*time.Minute))
	publish(t, attacker, evilPushed, events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "pod-1"}, Resource: "default", Serial: "abcdef04", Version: "66", Streams: 9, Kind: "pushed"}, t0.Add(7*time.Minute))
	publish(t, attacker, evilDown, events.PodDown{Pod: evil, Reason: "shutdown"}, t0.Add(7*time.Minute))
	pushed, _ := events.PodEventSubject(events.PodRef{Namespace: "default", Name: "pod-0"}, events.PodEventSecretPushed)
	down, _ := events.PodEventSubject(events.PodRef{Namespace: "default", Name: "pod-0"}, events.PodEventDown)
	publish(t, pod, pushed, events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "pod-0"}, Resource: "default", Serial: "abcdef04", Version: "9", Streams: 1, Kind: "pushed"}, t0.Add(5*time.Minute))
	publish(t, pod, down, events.PodDown{Pod: events.PodRef{Namespace: "default", Name: "pod-0"}, Reason: "shutdown"}, t0.Add(6*time.Minute))

	auditor := m.Conn(t, policy.Audit, nil)
	var snap inventory.Snapshot
	testkit.Eventually(t, "the inventory holds every pod's newest certificate and pod-0's push and stop", func() bool {
		snap, err = inventory.Read(ctx, auditor)
		if err != nil || len(snap.Certs) != 5 || snap.Trust == nil {
			return false
		}
		for _, c := range snap.Certs {
			if c.Serial != "abcdef04" || c.Renewals > 3 {
				return false
			}
			if c.Pod == "default/pod-0" && (c.Streams != 1 || !c.Down) {
				return false
			}
			if c.Pod == "default/pod-1" && (c.Streams != 0 || c.Down || c.Version != "") {
				t.Fatalf("attacker/pod-1 changed default/pod-1's record: %+v", c)
			}
		}
		return true
	})
	if snap.Trust.Generation != 3 || len(snap.Trust.Roots) != 1 || snap.Trust.Roots[0].Fingerprint != rootFP {
		t.Fatalf("trust record from the bundle request: %+v", snap.Trust)
	}
	if got := snap.Find("pod-3"); len(got) != 1 || got[0].SPIFFEID != "spiffe://td/ns/default/sa/pod-3" {
		t.Fatalf("find by pod: %+v", got)
	}
	if got := snap.Find("ABCDEF04"); len(got) != 5 {
		t.Fatalf("find by serial prefix: %d records", len(got))
	}
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("the inventory role was refused doing its job: %v", e)
	}
}

// TestRenewalsWithinASecond: two certificates with the same notBefore (X.509 has
// whole seconds) are told apart by when they were issued, whatever their serials.
func TestRenewalsWithinASecond(t *testing.T) {
	a, b := issued("p", 1), issued("p", 1)
	a.Serial, b.Serial = "ff01", "0002" // the later one has the smaller serial
	c, _ := inventory.Apply(nil, a, meta(t0))
	c, changed := inventory.Apply(c, b, meta(t0.Add(300*time.Millisecond)))
	if !changed || c.Serial != "0002" || c.Renewals != 1 {
		t.Fatalf("the later renewal lost: %+v", c)
	}
	if _, changed := inventory.Apply(c, a, meta(t0)); changed {
		t.Fatal("the earlier certificate came back")
	}
}

// TestMalformedRecordIsSkipped: a value written malformed with the inventory
// credential (garbage, a half record, a broken trust record) hides itself and
// nothing else: an auditor's read lists every other certificate and names what it
// skipped; the keeper replaces the record with that holder's next certificate.
func TestMalformedRecordIsSkipped(t *testing.T) {
	m := bustest.SecureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := m.Conn(t, policy.Signer, nil)
	if _, err := bus.EnsureEventStream(ctx, bustest.JetStream(t, signer), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	rootPEM, _ := selfSigned(t)
	if _, err := signer.QueueSubscribe(events.SubjectTrustBundle, events.SignerQueue, func(msg *nats.Msg) {
		r, _ := events.NewMsg(msg.Reply, "signer", events.BundleReply{TrustDomain: "td", Roots: []string{rootPEM}, Generation: 1})
		_ = signer.PublishMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	var errs bustest.Errors
	inv := m.Conn(t, policy.Inventory, &errs)
	k, err := inventory.NewKeeper(ctx, inv, 1, clock.Real{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	kctx, kcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(kctx) }()
	t.Cleanup(func() {
		kcancel()
		if err := <-done; err != nil {
			t.Errorf("keeper: %v", err)
		}
	})
	for _, pod := range []string{"pod-a", "pod-b", "pod-c"} {
		publish(t, signer, events.SubjectCertIssued, issued(pod, 1), t0)
	}
	auditor := m.Conn(t, policy.Audit, nil)
	testkit.Eventually(t, "three certificates and the trust record", func() bool {
		snap, err := inventory.Read(ctx, auditor)
		return err == nil && len(snap.Certs) == 3 && snap.Trust != nil
	})

	// The attack: malformed values written with the inventory credential.
	bad := inventory.CertKey(events.PodRef{Namespace: "default", Name: "pod-b"}, "default", "")
	for key, v := range map[string]string{
		bad:                  "\x1b[2J\x1b[31mnot json",
		"pod.ghost.64656661": `{"pod":"ghost","resource":"default"}`,
		"id.6162":            `[1,2,3]`,
		inventory.TrustKey:   `{"roots":`,
	} {
		if _, err := k.Bucket().Put(ctx, key, []byte(v)); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	snap, err := inventory.Read(ctx, auditor)
	if err != nil {
		t.Fatalf("one bad record failed the whole read: %v", err)
	}
	if len(snap.Certs) != 2 || snap.Certs[0].Pod == "default/pod-b" || snap.Certs[1].Pod == "default/pod-b" {
		t.Fatalf("certificates: %+v", snap.Certs)
	}
	if snap.Trust != nil {
		t.Fatalf("the broken trust record was taken: %+v", snap.Trust)
	}
	var keys []string
	for _, s := range snap.Skipped {
		keys = append(keys, s.Key)
	}
	want := []string{"id.6162", bad, "pod.ghost.64656661", inventory.TrustKey}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("skipped %v, want %v", keys, want)
	}
	line := snap.SkippedLine()
	if !strings.Contains(line, "4 malformed inventory record(s) skipped") || strings.ContainsAny(line, "\x1b\n") {
		t.Fatalf("skipped line %q", line)
	}
	// The keeper replaces pod-b's record with its next certificate.
	publish(t, signer, events.SubjectCertIssued, issued("pod-b", 2), t0.Add(time.Minute))
	testkit.Eventually(t, "pod-b's next certificate replaces the garbage", func() bool {
		snap, err := inventory.Read(ctx, auditor)
		if err != nil || len(snap.Certs) != 3 {
			return false
		}
		for _, s := range snap.Skipped {
			if s.Key == bad {
				return false
			}
		}
		return len(snap.Find("pod-b")) == 1 && snap.Find("pod-b")[0].Serial == "abcdef02"
	})
	if e := errs.All(); len(e) > 0 {
		t.Fatalf("the inventory role was refused: %v", e)
	}
}

// Decode keeps what it can read, whatever else the bucket holds.
func TestDecodeSkipsWhatItCannotRead(t *testing.T) {
	good, _ := inventory.Apply(nil, issued("p", 1), meta(t0))
	gb, err := json.Marshal(good)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 10000)
	snap := inventory.Decode(map[string][]byte{
		"pod.p.64": gb, "pod.q.64": nil, "pod.r.64": []byte(`{"serial":"01","spiffe_id":"spiffe://td/x"}`),
		"pod." + long: []byte("{"), "trust": []byte(`"a string"`),
	})
	if len(snap.Certs) != 1 || snap.Certs[0].Serial != good.Serial || snap.Trust != nil || len(snap.Skipped) != 4 {
		t.Fatalf("%+v", snap)
	}
	for _, s := range snap.Skipped {
		if len(s.Key) > 200 || len(s.Reason) > 200 || s.Reason == "" {
			t.Errorf("skipped %+v", s)
		}
	}
}

// A pod that refuses the certificates it is issued serves the one it last pushed:
// when that one has expired, the record says so (status counts it as expired), even
// though the newest certificate issued to the pod is fresh.
func TestExpiredServedCertificateCountsAsExpired(t *testing.T) {
	c, _ := inventory.Apply(nil, issued("p", 1), meta(t0.Add(time.Minute)))
	c, _ = inventory.Apply(c, events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "p"}, Resource: "default", Serial: "abcdef01", Version: "1", Streams: 1, Kind: "pushed"}, meta(t0.Add(time.Minute)))
	for gen := 2; gen <= 12; gen++ { // issued, never pushed
		c, _ = inventory.Apply(c, issued("p", gen), meta(t0.Add(time.Duration(gen)*time.Minute)))
	}
	now := t0.Add(12*time.Minute + 30*time.Second) // abcdef01 expired at 3m, abcdef0c is fresh
	w := c.Warnings(now, nil)
	if len(w) != 1 || !strings.HasPrefix(w[0], "expired: the pod serves serial abcdef01") {
		t.Fatalf("warnings %v", w)
	}
	// Once it pushes the fresh one, nothing to say.
	c, _ = inventory.Apply(c, events.SecretPushed{Pod: events.PodRef{Namespace: "default", Name: "p"}, Resource: "default", Serial: "abcdef0c", Version: "2", Streams: 1, Kind: "pushed"}, meta(now))
	if w := c.Warnings(now, nil); len(w) != 0 {
		t.Fatalf("after the push: %v", w)
	}
}
